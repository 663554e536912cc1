//! The wire contract with the kubelet: the generated messages encode to, and decode from, the
//! bytes the upstream definitions' field numbers and types give (written out by hand here,
//! not produced by the same generator), and the services carry the upstream package names
//! that form the gRPC method paths. A wrong tag or type in proto/ fails here.

use gpuslice_dra::plugin::{DraService, RegistrationService};
use gpuslice_dra::proto::{dra_v1, dra_v1beta1, pluginregistration as reg};
use prost::Message;
use tonic::server::NamedService;

/// Length-delimited field `tag` with `payload`.
fn field(tag: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 128);
    let mut out = vec![(tag << 3) | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// Claim{namespace=1:"ns", uid=2:"u1", name=3:"c"}.
fn claim_bytes() -> Vec<u8> {
    cat(&[field(1, b"ns"), field(2, b"u1"), field(3, b"c")])
}

macro_rules! dra_wire_test {
    ($test:ident, $api:ident) => {
        #[test]
        fn $test() {
            use $api::*;
            let claim = Claim {
                namespace: "ns".into(),
                uid: "u1".into(),
                name: "c".into(),
            };
            // NodePrepareResourcesRequest{claims=1: [Claim]}
            let expected = field(1, &claim_bytes());
            let request = NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            };
            assert_eq!(request.encode_to_vec(), expected);
            assert_eq!(
                NodePrepareResourcesRequest::decode(&expected[..]).unwrap(),
                request
            );
            let request = NodeUnprepareResourcesRequest {
                claims: vec![claim],
            };
            assert_eq!(request.encode_to_vec(), expected);
            assert_eq!(
                NodeUnprepareResourcesRequest::decode(&expected[..]).unwrap(),
                request
            );

            // NodePrepareResourcesResponse{claims=1: map<string, NodePrepareResourceResponse>}
            // A map entry is a message {key=1, value=2}. Device{request_names=1, pool_name=2,
            // device_name=3, cdi_device_ids=4}; NodePrepareResourceResponse{devices=1, error=2}.
            let device = cat(&[
                field(1, b"r"),
                field(2, b"p"),
                field(3, b"d"),
                field(4, b"k/c=x"),
            ]);
            let value = field(1, &device);
            let expected = field(1, &cat(&[field(1, b"u1"), field(2, &value)]));
            let response = NodePrepareResourcesResponse {
                claims: [(
                    "u1".to_string(),
                    NodePrepareResourceResponse {
                        devices: vec![Device {
                            request_names: vec!["r".into()],
                            pool_name: "p".into(),
                            device_name: "d".into(),
                            cdi_device_ids: vec!["k/c=x".into()],
                        }],
                        error: String::new(),
                    },
                )]
                .into(),
            };
            assert_eq!(response.encode_to_vec(), expected);
            assert_eq!(
                NodePrepareResourcesResponse::decode(&expected[..]).unwrap(),
                response
            );
            let failed = NodePrepareResourceResponse {
                devices: vec![],
                error: "e".into(),
            };
            assert_eq!(failed.encode_to_vec(), field(2, b"e"));

            // NodeUnprepareResourcesResponse{claims=1: map<string, {error=1}>}
            let expected = field(1, &cat(&[field(1, b"u1"), field(2, &field(1, b"e"))]));
            let response = NodeUnprepareResourcesResponse {
                claims: [(
                    "u1".to_string(),
                    NodeUnprepareResourceResponse { error: "e".into() },
                )]
                .into(),
            };
            assert_eq!(response.encode_to_vec(), expected);
            assert_eq!(
                NodeUnprepareResourcesResponse::decode(&expected[..]).unwrap(),
                response
            );
        }
    };
}

dra_wire_test!(dra_v1_messages_have_the_upstream_field_numbers, dra_v1);
dra_wire_test!(
    dra_v1beta1_messages_have_the_upstream_field_numbers,
    dra_v1beta1
);

#[test]
fn registration_messages_have_the_upstream_field_numbers() {
    // PluginInfo{type=1, name=2, endpoint=3, supported_versions=4}
    let expected = cat(&[
        field(1, b"DRAPlugin"),
        field(2, b"gpuslice.dev"),
        field(3, b"/s"),
        field(4, b"v1.DRAPlugin"),
        field(4, b"v1beta1.DRAPlugin"),
    ]);
    let info = reg::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "gpuslice.dev".into(),
        endpoint: "/s".into(),
        supported_versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
    };
    assert_eq!(info.encode_to_vec(), expected);
    assert_eq!(reg::PluginInfo::decode(&expected[..]).unwrap(), info);
    // RegistrationStatus{plugin_registered=1 (varint bool), error=2}
    let expected = cat(&[vec![0x08, 0x01], field(2, b"x")]);
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    assert_eq!(status.encode_to_vec(), expected);
    assert_eq!(
        reg::RegistrationStatus::decode(&expected[..]).unwrap(),
        status
    );
    assert!(reg::InfoRequest {}.encode_to_vec().is_empty());
    assert!(reg::RegistrationStatusResponse {}
        .encode_to_vec()
        .is_empty());
}

#[test]
fn services_carry_the_upstream_package_names() {
    // The gRPC method path is /<package>.<Service>/<Method>: these are what the kubelet calls.
    assert_eq!(
        <dra_v1::dra_plugin_server::DraPluginServer<DraService> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        <dra_v1beta1::dra_plugin_server::DraPluginServer<DraService> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        <reg::registration_server::RegistrationServer<RegistrationService> as NamedService>::NAME,
        "pluginregistration.Registration"
    );
}

#[test]
fn the_health_service_has_the_upstream_names_and_field_numbers() {
    use gpuslice_dra::plugin::HealthService;
    use gpuslice_dra::proto::dra_health_v1alpha1 as h;
    // The kubelet calls /v1alpha1.DRAResourceHealth/NodeWatchResources.
    assert_eq!(
        <h::dra_resource_health_server::DraResourceHealthServer<HealthService> as NamedService>::NAME,
        "v1alpha1.DRAResourceHealth"
    );
    // NodeWatchResourcesResponse{devices=1: [DeviceHealth{device=1: DeviceIdentifier{
    // pool_name=1, device_name=2}, health=2 (enum varint), last_updated_time=3 (int64)}]}
    let identifier = cat(&[field(1, b"p"), field(2, b"d")]);
    let device = cat(&[field(1, &identifier), vec![0x10, 0x02], vec![0x18, 0x07]]);
    let expected = field(1, &device);
    let response = h::NodeWatchResourcesResponse {
        devices: vec![h::DeviceHealth {
            device: Some(h::DeviceIdentifier {
                pool_name: "p".into(),
                device_name: "d".into(),
            }),
            health: h::HealthStatus::Unhealthy as i32,
            last_updated_time: 7,
        }],
    };
    assert_eq!(response.encode_to_vec(), expected);
    assert_eq!(
        h::NodeWatchResourcesResponse::decode(&expected[..]).unwrap(),
        response
    );
    assert_eq!(h::HealthStatus::Healthy as i32, 1);
    assert_eq!(h::HealthStatus::Unknown as i32, 0);
}
