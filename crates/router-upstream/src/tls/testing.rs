//! Test support: a throwaway certificate authority whose files are written to a
//! directory of the test's own, and engines answering over real TLS on loopback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// A certificate authority of a test's own, and the directory its files go to
/// (removed when it is dropped).
pub(super) struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate the authority signed, with its key, as files and as rustls takes
/// them.
pub(super) struct Issued {
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
}

impl Pki {
    /// An authority whose files go to a directory named after `test`.
    pub(super) fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("switchyard-tls-{test}-{}", std::process::id()));
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

    /// Writes `name` into the test's directory.
    pub(super) fn file(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// The authority's certificate, as a CA file.
    pub(super) fn ca_file(&self) -> PathBuf {
        self.file("ca.pem", self.ca.pem())
    }

    /// The authority alone, as a server trusting client certificates it signed.
    pub(super) fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        roots
    }

    /// A certificate for `names` (DNS names or IP addresses), signed by the
    /// authority, written as `<file>.pem` and `<file>.key`.
    pub(super) fn issue(&self, file: &str, names: &[&str]) -> Issued {
        let key_pair = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key_pair, &self.ca)
            .unwrap();
        Issued {
            cert_file: self.file(&format!("{file}.pem"), cert.pem()),
            key_file: self.file(&format!("{file}.key"), key_pair.serialize_pem()),
            chain: vec![cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(key_pair.serialize_der()).into(),
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What an engine of [`engine`] does after its first answer on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Keeps the connection for the next request.
    KeepOpen,
    /// Closes the connection (over TLS with a `close_notify`) and says so.
    Close,
}

/// An engine on loopback answering every request with 200 and `<path> over TLS`
/// (or `over TCP` without `tls`), each connection in a task the engine owns.
pub(super) struct Engine {
    pub(super) address: SocketAddr,
    /// Connections accepted.
    pub(super) connections: Arc<AtomicUsize>,
    /// One message each time the engine closed a connection after an answer.
    pub(super) closed: mpsc::UnboundedReceiver<()>,
    /// The accept loop and every connection: dropped with the engine.
    _tasks: JoinSet<()>,
}

/// What a TLS engine with `server`'s certificate runs on; with `clients`, it requires a client
/// certificate signed by one of them.
pub(super) fn tls_config(server: &Issued, clients: Option<RootCertStore>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match clients {
        Some(roots) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap(),
        ),
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(server.chain.clone(), server.key.clone_key())
        .unwrap();
    Arc::new(config)
}

/// Starts an engine on 127.0.0.1: over TLS with `tls`, else plain.
pub(super) async fn engine(tls: Option<Arc<ServerConfig>>, after: After) -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    let (closing, closed) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        let mut served = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let closing = closing.clone();
            match tls.clone() {
                None => served.spawn(serve(tcp, after, closing, "TCP")),
                Some(config) => served.spawn(async move {
                    match TlsAcceptor::from(config).accept(tcp).into_fallible().await {
                        Ok(tls) => serve(tls, after, closing, "TLS").await,
                        // Reading on until the client leaves lets the alert reach
                        // it whole, not cut short by a reset.
                        Err((_, mut tcp)) => drain(&mut tcp).await,
                    }
                }),
            };
        }
    });
    Engine {
        address,
        connections,
        closed,
        _tasks: tasks,
    }
}

/// Answers requests on `stream` until the client leaves or `after` closes it.
async fn serve<S>(mut stream: S, after: After, closing: mpsc::UnboundedSender<()>, over: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let Some(path) = read_request(&mut stream).await else {
            return;
        };
        let body = format!("{path} over {over}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if after == After::Close {
            let _ = stream.shutdown().await;
            let _ = closing.send(());
            drain(&mut stream).await;
            return;
        }
    }
}

/// The path of the next request, its body read and dropped; `None` once the client
/// leaves.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut request = Vec::new();
    let mut chunk = [0_u8; 4096];
    let end = loop {
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&request[..end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |l| l.trim().parse::<usize>().unwrap());
    let mut left = (end + length).saturating_sub(request.len());
    while left > 0 {
        match stream.read(&mut chunk[..left.min(4096)]).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => left -= n,
        }
    }
    Some(head.split(' ').nth(1).unwrap_or_default().to_owned())
}

/// Reads until the other side closes.
async fn drain<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut chunk = [0_u8; 4096];
    while matches!(stream.read(&mut chunk).await, Ok(n) if n > 0) {}
}
