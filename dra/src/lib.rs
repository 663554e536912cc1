//! gpuslice-dra: the Kubernetes DRA driver (kubelet plugin) of gpuslice.
//!
//! It publishes the node's GPUs as ResourceSlices ([`publish`], two models: fixed products and
//! consumable capacity, [`model`]), and turns each allocated ResourceClaim the kubelet hands it
//! into an enforced slice: a limit file, a region directory and a transient CDI spec
//! ([`prepare`], a functional core with no gRPC in it), served over the kubelet's gRPC APIs
//! ([`plugin`], protos in `proto/`, generated code in [`proto`]).
//!
//! Its own crate rather than a `gpuslice dra` subcommand: it needs tokio, tonic and kube,
//! which the CLI (copied into every container) and the shim must never pull in.

pub mod health;
pub mod inventory;
pub mod model;
pub mod node_lock;
pub mod plugin;
pub mod prepare;
pub mod proto;
pub mod publish;
pub mod quantity;

/// The DRA driver name: the `driver` of every ResourceSlice and allocation result of ours,
/// and the domain of our device attributes.
pub const DRIVER_NAME: &str = "gpuslice.dev";
