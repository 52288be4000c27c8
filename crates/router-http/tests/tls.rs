//! Engines at `https://` URLs: a simulated engine behind a TLS front of the test's
//! own, whose certificates a throwaway authority signs, is probed, introspected and
//! served over TLS with the `engine_tls` section's files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use router_config::{EngineConfig, EngineTlsConfig, ModelConfig};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::common::*;

/// A certificate authority of the test's own, its files in a directory removed when
/// it is dropped.
struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("switchyard-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Switchyard test CA {test}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { dir, ca }
    }

    fn write(&self, name: &str, contents: String) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// A certificate for `name` and its key, as PEM files `<file>.pem`, `<file>.key`.
    fn issue(&self, file: &str, name: &str) -> (PathBuf, PathBuf, rcgen::Certificate, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
        let cert_file = self.write(&format!("{file}.pem"), cert.pem());
        let key_file = self.write(&format!("{file}.key"), key.serialize_pem());
        (cert_file, key_file, cert, key)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS front for `backend` on 127.0.0.1 with a certificate for 127.0.0.1 that
/// requires a client certificate `pki` signed; it counts the handshakes it
/// completes. The front and every connection end when the task set is dropped.
async fn tls_front(pki: &Pki, backend: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>, JoinSet<()>) {
    let (_, _, cert, key) = pki.issue("engine", "127.0.0.1");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut clients = RootCertStore::empty();
    clients.add(pki.ca.der().clone()).unwrap();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(clients), Arc::clone(&provider))
            .build()
            .unwrap();
    let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&handshakes);
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, counted) = (acceptor.clone(), Arc::clone(&counted));
            connections.spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(mut plain) = TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (address, handshakes, tasks)
}

#[tokio::test]
async fn an_https_engine_is_probed_introspected_and_served_over_mutual_tls() {
    let engine = sim(|_| {}).await;
    let pki = Pki::new("serving-tls");
    let (front, handshakes, _front) = tls_front(&pki, engine.ports().http).await;
    let (cert_file, key_file, _, _) = pki.issue("router", "router.example");
    // No role: the engine's /server_info, read over TLS, tells it.
    let model = ModelConfig::new(
        "m",
        vec![EngineConfig::new("A", format!("https://{front}"))],
    );
    let mut config = config(vec![model]);
    config.engine_tls = Some(EngineTlsConfig {
        ca_file: Some(pki.write("ca.pem", pki.ca.pem())),
        cert_file: Some(cert_file),
        key_file: Some(key_file),
    });
    let router = router(config).await;
    let response = post(&router, &chat("m", "hello over TLS")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-switchyard-engine"], "A");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(engine.visits().answered, 1, "the engine served the request");
    let text = metrics(&router).await;
    assert!(
        text.contains(r#"switchyard_engine_healthy{engine="A"} 1"#),
        "probed healthy over TLS: {text}"
    );
    assert!(handshakes.load(Ordering::SeqCst) >= 1);
    router.shutdown().await;
    engine.shutdown().await;
}
