//! The API client's trust, on a host whose system trust store is empty
//! (`SSL_CERT_FILE` an empty file and `SSL_CERT_DIR` an empty directory,
//! which is all rustls-native-certs then reads): a plain `http://` server
//! and a server whose CA the configuration carries (as in a pod) are
//! reached; a TLS server whose CA is unknown is refused with the
//! certificate problem named; `insecure-skip-tls-verify` needs no store;
//! an `https://` kubeconfig without a CA fails to build with what to do
//! about it.
//!
//! One test function: the trust store is process-wide environment, set once
//! before any thread that could read it starts.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use dra_cpu_tests::apiserver::FakeApiServer;
use dra_plugin::api_client::{client_from_config, error_chain, kube_client};
use k8s_openapi::api::core::v1::Node;
use tokio_rustls::rustls;

const NODE: &str = "node-tls";

/// A CA and a server certificate it signed for 127.0.0.1.
struct Pki {
    ca_pem: String,
    ca_der: Vec<u8>,
    server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    server_key: rustls::pki_types::PrivateKeyDer<'static>,
}

fn pki(name: &str) -> Pki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} CA"));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
    let server_key = rcgen::KeyPair::generate().expect("server key");
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("server params")
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    Pki {
        ca_pem: ca.pem(),
        ca_der: ca.der().to_vec(),
        server_chain: vec![server.der().clone(), ca.der().clone()],
        server_key: rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
    }
}

/// A TLS front for `backend` (the fake API server), on a free port.
async fn tls_front(pki: &Pki, backend: SocketAddr) -> SocketAddr {
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
        .expect("server TLS config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                if let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    addr
}

fn kubeconfig(
    dir: &std::path::Path,
    name: &str,
    server: &str,
    ca_pem: Option<&str>,
) -> std::path::PathBuf {
    use std::fmt::Write;
    let mut cluster = format!("    server: {server}\n");
    if let Some(pem) = ca_pem {
        let path = dir.join(format!("{name}-ca.crt"));
        std::fs::write(&path, pem).expect("CA file");
        let _ = writeln!(cluster, "    certificate-authority: {}", path.display());
    }
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
    );
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).expect("kubeconfig");
    path
}

async fn get_node(client: kube::Client) -> Result<Node, kube::Error> {
    kube::Api::<Node>::all(client).get(NODE).await
}

#[test]
fn trust_comes_from_the_config_and_the_system_store_only_when_needed() {
    let empty = tempfile::tempdir().expect("tempdir");
    let empty_file = empty.path().join("no-certificates.pem");
    std::fs::write(&empty_file, "").expect("empty bundle");
    let empty_dir = empty.path().join("no-certificates");
    std::fs::create_dir(&empty_dir).expect("empty dir");
    // Before any other thread exists: see the module comment.
    std::env::set_var("SSL_CERT_FILE", &empty_file);
    std::env::set_var("SSL_CERT_DIR", &empty_dir);

    let api = FakeApiServer::start().expect("fake API server");
    api.insert_node(NODE).expect("node");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // 1. Plain http: starts and reads the node.
        let client = kube_client(Some(api.kubeconfig_path()))
            .await
            .unwrap_or_else(|e| panic!("http client: {e:#}"));
        let node = get_node(client).await.expect("GET node over http");
        assert_eq!(node.metadata.name.as_deref(), Some(NODE));

        let ours = pki("cluster");
        let front = tls_front(&ours, api.addr()).await;
        let https = format!("https://{front}");

        // 2. In-cluster shape: the config's own CA bytes and file.
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ours.ca_pem).expect("ca.crt");
        let mut in_cluster = kube::Config::new(https.parse().expect("url"));
        in_cluster.root_cert = Some(vec![ours.ca_der.clone()]);
        in_cluster.root_cert_file = Some(ca_file);
        let client =
            client_from_config(in_cluster).unwrap_or_else(|e| panic!("in-cluster client: {e:#}"));
        let node = get_node(client).await.expect("GET node over TLS, own CA");
        assert_eq!(node.metadata.name.as_deref(), Some(NODE));

        // 3. A kubeconfig with its own CA file: the same.
        let path = kubeconfig(dir.path(), "own-ca", &https, Some(&ours.ca_pem));
        let client = kube_client(Some(&path))
            .await
            .unwrap_or_else(|e| panic!("kubeconfig with CA: {e:#}"));
        get_node(client).await.expect("GET node, kubeconfig CA");

        // 4. A CA that did not sign the server: refused, and the log line
        // (the error chain) names the certificate problem.
        let other = pki("other");
        let path = kubeconfig(dir.path(), "wrong-ca", &https, Some(&other.ca_pem));
        let client = kube_client(Some(&path))
            .await
            .unwrap_or_else(|e| panic!("kubeconfig with another CA: {e:#}"));
        let err = get_node(client).await.expect_err("an unknown CA must fail");
        let said = error_chain(&err);
        assert!(said.contains("invalid peer certificate"), "{said}");
        assert!(said.contains("UnknownIssuer"), "{said}");

        // 5. insecure-skip-tls-verify: nothing is checked, no store read.
        let path = kubeconfig(dir.path(), "skip-verify", &https, None);
        let text = std::fs::read_to_string(&path).expect("kubeconfig");
        let text = text.replace(
            &format!("    server: {https}\n"),
            &format!("    server: {https}\n    insecure-skip-tls-verify: true\n"),
        );
        std::fs::write(&path, text).expect("kubeconfig");
        let client = kube_client(Some(&path))
            .await
            .unwrap_or_else(|e| panic!("kubeconfig skipping verification: {e:#}"));
        get_node(client).await.expect("GET node, verification off");

        // 6. https without a CA, and no system store: a clear refusal.
        let path = kubeconfig(dir.path(), "no-ca", &https, None);
        let said = match kube_client(Some(&path)).await {
            Ok(_) => panic!("an https kubeconfig without a CA built a client with no trust store"),
            Err(e) => format!("{e:#}"),
        };
        assert!(said.contains("names no certificate-authority"), "{said}");
        assert!(said.contains("SSL_CERT_FILE"), "{said}");
        assert!(said.contains("No CA certificates were loaded"), "{said}");
    });
}
