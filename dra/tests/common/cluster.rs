//! A real Kubernetes control plane for the cluster tests: upstream's etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, built from the Go module proxy by
//! `.ci/k8s-setup.sh` at the release `dra/k8s/<minor>/go.mod` pins, started on loopback the way
//! a cluster runs them and stopped cleanly.
//!
//! * etcd on two free loopback ports, its data in the test's scratch directory.
//! * kube-apiserver: a self-signed serving certificate it makes itself (`--cert-dir`), clients
//!   trust exactly that certificate; static-token authentication (`--token-auth-file`) for the
//!   admin (`system:masters`), the controller manager and the scheduler; `--authorization-mode
//!   =RBAC`; service-account tokens signed with a key pair made here with openssl; the
//!   version's default feature gates (no `--feature-gates` unless a test asks); an audit log of
//!   every request (`audit.log`, JSON lines) so a test can see which calls a client made.
//! * kube-controller-manager with per-controller service-account credentials (as kubeadm runs
//!   it), every default controller but node lifecycle (there is no kubelet to heartbeat).
//! * kube-scheduler with its default profile.
//!
//! Readiness is polled: etcd's `/health`, the API server's `/readyz`, the controller manager's
//! and scheduler's `/healthz`, then the `default` ServiceAccount the controller manager makes.
//! Every process gets `PR_SET_PDEATHSIG` (a killed test leaves nothing running) and logs to a
//! file in the scratch directory, whose tail a failure shows.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

use super::Scratch;

/// The minor versions the cluster tests run against: `GPUSLICE_K8S_MINORS` (space-separated,
/// each a directory of `dra/k8s/`), default the pinned current one.
pub fn minors() -> Vec<String> {
    std::env::var("GPUSLICE_K8S_MINORS")
        .unwrap_or_else(|_| "1.37".into())
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// One built release of Kubernetes.
#[derive(Debug, Clone)]
pub struct Release {
    /// `1.37`.
    pub minor: String,
    /// `v1.37.2`.
    pub version: String,
    /// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl.
    pub bin: PathBuf,
}

impl Release {
    /// The release `dra/k8s/<minor>/go.mod` pins, with its binaries from
    /// `$GPUSLICE_K8S_BIN`, else `${GPUSLICE_K8S_CACHE:-/var/cache/gpuslice}/k8s-<x.y.z>/bin`
    /// (where `.ci/k8s-setup.sh` builds them); `Err` says what is missing.
    pub fn find(minor: &str) -> Result<Release, String> {
        let module = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("k8s")
            .join(minor)
            .join("go.mod");
        let text = fs::read_to_string(&module).map_err(|e| {
            format!(
                "{}: {e} (no module for Kubernetes {minor})",
                module.display()
            )
        })?;
        let version = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                (words.next()? == "k8s.io/kubernetes").then(|| words.next())?
            })
            .find(|v| v.starts_with('v'))
            .ok_or_else(|| format!("{} requires no k8s.io/kubernetes", module.display()))?
            .to_string();
        let bin = match std::env::var_os("GPUSLICE_K8S_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(
                std::env::var("GPUSLICE_K8S_CACHE")
                    .unwrap_or_else(|_| "/var/cache/gpuslice".into()),
            )
            .join(format!("k8s-{}", &version[1..]))
            .join("bin"),
        };
        for name in BINARIES {
            if !bin.join(name).is_file() {
                return Err(format!(
                    "Kubernetes {version}: {} is missing (run .ci/k8s-setup.sh {minor}, with \
                     GPUSLICE_K8S_CACHE set as for the tests)",
                    bin.join(name).display()
                ));
            }
        }
        Ok(Release {
            minor: minor.to_string(),
            version,
            bin,
        })
    }

    /// The minor version as a number (`37`).
    pub fn minor_number(&self) -> u32 {
        self.minor
            .split('.')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("minor version {:?} is not 1.N", self.minor))
    }

    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

const BINARIES: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// How long a component may take to become ready on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a component may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Audit policy: every request at Metadata level (who, verb, resource, status code).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n  - level: Metadata\n";

/// A running process of the control plane.
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// A running control plane; stopped (SIGTERM, in reverse start order) on drop or by [`stop`].
///
/// [`stop`]: ControlPlane::stop
pub struct ControlPlane {
    pub release: Release,
    pub dir: Scratch,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The API server's self-signed certificate, the one CA every client trusts.
    pub ca: PathBuf,
    /// The admin's kubeconfig (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    components: Vec<Component>,
}

/// A free loopback port (bound and released: another process may take it in between, which
/// the component's start then reports).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn random_token() -> String {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The last `lines` lines of `path`.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes a kubeconfig for `server` trusting `ca`, authenticating with `token`.
pub fn write_kubeconfig(path: &Path, server: &str, ca: &Path, token: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
         certificate-authority: {}\nusers:\n- name: user\n  user:\n    token: {token}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: user\n\
         current-context: test\n",
        ca.display()
    );
    fs::write(path, text).unwrap();
}

/// A kube client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// `GET path` on an HTTPS endpoint that serves a self-signed certificate, unauthenticated;
/// the body when the status is 200.
async fn get_insecure(url: &str, path: &str) -> Option<String> {
    let mut config = kube::Config::new(url.parse().ok()?);
    config.accept_invalid_certs = true;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).ok()?;
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    client.request_text(request).await.ok()
}

/// `GET /health` on etcd's plain-HTTP client port.
fn etcd_healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller manager and the scheduler of `release`
    /// with the version's default feature gates plus `api_server_gates` (`Name=bool,...`,
    /// empty for none), and waits until each is ready.
    pub async fn start(release: &Release, api_server_gates: &str) -> ControlPlane {
        ControlPlane::start_with(release, api_server_gates, true).await
    }

    /// Only etcd and the API server (for what needs no controller or scheduler).
    pub async fn start_api_server(release: &Release, api_server_gates: &str) -> ControlPlane {
        ControlPlane::start_with(release, api_server_gates, false).await
    }

    async fn start_with(release: &Release, api_server_gates: &str, full: bool) -> ControlPlane {
        let dir = Scratch::new("k8s");
        let root = dir.path().to_path_buf();
        let mut plane = ControlPlane {
            release: release.clone(),
            url: String::new(),
            ca: root.join("apiserver/apiserver.crt"),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            dir,
            components: Vec::new(),
        };

        // Identities: static tokens for the admin and the two components, a service-account
        // signing key pair.
        let (admin, kcm, scheduler) = (random_token(), random_token(), random_token());
        fs::write(
            root.join("tokens.csv"),
            format!(
                "{admin},admin,admin,\"system:masters\"\n\
                 {kcm},system:kube-controller-manager,kcm\n\
                 {scheduler},system:kube-scheduler,scheduler\n"
            ),
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&root)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&["genrsa", "-out", "sa.key", "2048"]);
        openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        fs::write(root.join("audit-policy.yaml"), AUDIT_POLICY).unwrap();

        // etcd.
        let (client_port, peer_port) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        plane.spawn(
            "etcd",
            &[
                "--name=default".into(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                // A test's data need not survive a power cut.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        plane
            .await_ready("etcd", || async { etcd_healthy(client_port) })
            .await;

        // The API server.
        let port = free_port();
        plane.url = format!("https://127.0.0.1:{port}");
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", root.join("apiserver").display()),
            format!("--token-auth-file={}", root.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!(
                "--service-account-key-file={}",
                root.join("sa.pub").display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                root.join("sa.key").display()
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // The "kubernetes" Service's endpoints may not be a loopback address.
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            format!(
                "--audit-policy-file={}",
                root.join("audit-policy.yaml").display()
            ),
            format!("--audit-log-path={}", root.join("audit.log").display()),
            "--audit-log-mode=blocking".into(),
        ];
        if !api_server_gates.is_empty() {
            args.push(format!("--feature-gates={api_server_gates}"));
        }
        plane.spawn("kube-apiserver", &args);
        let ca = plane.ca.clone();
        plane
            .await_ready("kube-apiserver (its certificate)", || {
                let ca = ca.clone();
                async move { ca.is_file() }
            })
            .await;
        write_kubeconfig(&plane.admin_kubeconfig, &plane.url, &plane.ca, &admin);
        let (kcm_config, scheduler_config) = (
            root.join("kube-controller-manager.kubeconfig"),
            root.join("kube-scheduler.kubeconfig"),
        );
        write_kubeconfig(&kcm_config, &plane.url, &plane.ca, &kcm);
        write_kubeconfig(&scheduler_config, &plane.url, &plane.ca, &scheduler);
        let admin_client = client_from(&plane.admin_kubeconfig).await;
        plane
            .await_ready("kube-apiserver (/readyz)", || {
                let client = admin_client.clone();
                async move {
                    let request = http::Request::get("/readyz").body(Vec::new()).unwrap();
                    client.request_text(request).await.is_ok_and(|t| t == "ok")
                }
            })
            .await;
        if !full {
            return plane;
        }

        // The controller manager and the scheduler.
        let kcm_port = free_port();
        let kubeconfig = kcm_config.display().to_string();
        plane.spawn(
            "kube-controller-manager",
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                format!("--cert-dir={}", root.join("kcm").display()),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    root.join("sa.key").display()
                ),
                format!("--root-ca-file={}", plane.ca.display()),
                // No kubelet heartbeats the test's Node: its lifecycle controller would taint
                // it unreachable.
                "--controllers=*,-nodelifecycle".into(),
            ],
        );
        let scheduler_port = free_port();
        let kubeconfig = scheduler_config.display().to_string();
        plane.spawn(
            "kube-scheduler",
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={scheduler_port}"),
                format!("--cert-dir={}", root.join("scheduler").display()),
            ],
        );
        for (name, port) in [
            ("kube-controller-manager", kcm_port),
            ("kube-scheduler", scheduler_port),
        ] {
            let url = format!("https://127.0.0.1:{port}");
            plane
                .await_ready(name, || {
                    let url = url.clone();
                    async move { get_insecure(&url, "/healthz").await.as_deref() == Some("ok") }
                })
                .await;
        }
        // The controllers run and their credentials work: the service-account controller
        // has made the default namespace's ServiceAccount.
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(admin_client, "default");
        plane
            .await_ready("kube-controller-manager (ServiceAccount default)", || {
                let accounts = accounts.clone();
                async move { accounts.get_opt("default").await.ok().flatten().is_some() }
            })
            .await;
        plane
    }

    fn spawn(&mut self, name: &'static str, args: &[String]) {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = fs::File::create(&log).unwrap();
        let mut command = Command::new(self.release.tool(name));
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
        // parent; it only asks the kernel to SIGKILL the child when this thread exits.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.components.push(Component { name, child, log });
    }

    /// Polls `ready` until it holds; panics with the component's log when a component has
    /// exited or the time is up.
    async fn await_ready<F, Fut>(&mut self, what: &str, ready: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            if ready().await {
                eprintln!(
                    "cluster: {what} ready after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return;
            }
            for component in &mut self.components {
                if let Ok(Some(status)) = component.child.try_wait() {
                    panic!(
                        "{} exited ({status}) while waiting for {what}:\n{}",
                        component.name,
                        tail(&component.log, 40)
                    );
                }
            }
            assert!(
                start.elapsed() < READY_TIMEOUT,
                "{what} not ready after {READY_TIMEOUT:?}; last log lines:\n{}",
                self.components
                    .iter()
                    .map(|c| format!("--- {}\n{}", c.name, tail(&c.log, 15)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The admin's client.
    pub async fn admin(&self) -> kube::Client {
        client_from(&self.admin_kubeconfig).await
    }

    /// Runs the release's kubectl as the admin (or with `kubeconfig`); its output, whatever
    /// the exit status.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(self.release.tool("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// kubectl as the admin; panics (with its output) unless it succeeds; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.kubectl_stdin(args, None)
    }

    /// [`ControlPlane::kubectl`] with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_as(&self.admin_kubeconfig, args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A kubeconfig authenticating as ServiceAccount `namespace/name` with a token the API
    /// server issues (TokenRequest, as a pod's projected token).
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.kubectl(&["create", "token", name, "-n", namespace, "--duration=2h"]);
        let path = self
            .dir
            .path()
            .join(format!("{namespace}-{name}.kubeconfig"));
        write_kubeconfig(&path, &self.url, &self.ca, token.trim());
        path
    }

    /// The audit log's events (one JSON object per request) of `user`.
    pub fn audit_events(&self, user: &str) -> Vec<Value> {
        fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["user"]["username"] == user)
            .collect()
    }

    /// Stops every component (SIGTERM, newest first) and says which did not exit cleanly
    /// within [`STOP_TIMEOUT`] (then SIGKILLed).
    pub fn stop(&mut self) -> Result<(), String> {
        let mut unclean = Vec::new();
        while let Some(mut component) = self.components.pop() {
            // SAFETY: kill on the PID of a child this process spawned and has not reaped.
            unsafe {
                libc::kill(component.child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            let status = loop {
                match component.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    _ if Instant::now() > deadline => break None,
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            use std::os::unix::process::ExitStatusExt;
            // Without leader election the scheduler ends every run with "finished without
            // leader elect" and status 1, after its graceful shutdown.
            let by_design = component.name == "kube-scheduler"
                && fs::read_to_string(&component.log)
                    .is_ok_and(|log| log.contains("finished without leader elect"));
            match status {
                Some(s) if s.success() || s.signal() == Some(libc::SIGTERM) => {}
                Some(s) if s.code() == Some(1) && by_design => {}
                Some(s) => unclean.push(format!(
                    "{} exited {s} after SIGTERM:\n{}",
                    component.name,
                    tail(&component.log, 10)
                )),
                None => {
                    let _ = component.child.kill();
                    let _ = component.child.wait();
                    unclean.push(format!(
                        "{} still ran {STOP_TIMEOUT:?} after SIGTERM",
                        component.name
                    ));
                }
            }
        }
        if unclean.is_empty() {
            Ok(())
        } else {
            Err(unclean.join("\n"))
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A failed test shows what the scheduler and controller manager last said.
        if std::thread::panicking() {
            for component in &self.components {
                if component.name != "etcd" {
                    eprintln!("--- {} log:\n{}", component.name, tail(&component.log, 25));
                }
            }
        }
        if let Err(e) = self.stop() {
            eprintln!("cluster: {e}");
        }
    }
}
