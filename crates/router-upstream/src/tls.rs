//! TLS to engines at `https://` URLs (feature `tls`), with rustls and its `ring`
//! provider: the certificate authorities trusted (the system's, and those of an
//! optional CA file), an optional client certificate for engines that ask for one
//! (mutual TLS), and the handshake, which names the URL's host.

use std::fmt;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::url::Origin;

/// The largest certificate or key file read, in bytes (a whole system bundle of
/// authorities is about 200 KiB).
pub const MAX_PEM_BYTES: u64 = 1 << 20;
/// The least room given to one read of decrypted bytes.
const READ_CHUNK: usize = 16 << 10;

/// The files TLS to engines is set up from; each is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates of authorities trusted besides the system's.
    pub ca_file: Option<PathBuf>,
    /// The PEM certificate chain shown to engines that ask for a client certificate,
    /// the router's own first.
    pub cert_file: Option<PathBuf>,
    /// The PEM private key of `cert_file`'s first certificate.
    pub key_file: Option<PathBuf>,
}

/// Which of the [`TlsFiles`] a [`TlsError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// `ca_file`.
    Ca,
    /// `cert_file`.
    Cert,
    /// `key_file`.
    Key,
}

/// Why TLS to engines cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read or does not hold what it should.
    #[error("{}: {problem}", path.display())]
    File {
        /// Which file.
        file: TlsFile,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error("a client certificate and its key go together: give both files or neither")]
    Unpaired,
}

/// How engines at `https://` URLs are reached: see the module documentation.
/// Cheap to clone.
#[derive(Clone)]
pub struct EngineTls {
    connector: TlsConnector,
}

impl fmt::Debug for EngineTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineTls").finish_non_exhaustive()
    }
}

impl EngineTls {
    /// Trusts the system's certificate authorities and those of `files.ca_file`,
    /// and shows `files.cert_file` (with `files.key_file`) to engines that ask for
    /// a client certificate. System certificates that do not parse are skipped.
    ///
    /// # Errors
    /// A file is missing, too large (over [`MAX_PEM_BYTES`]) or holds no usable
    /// certificate or key; the key does not match the certificate; one of the
    /// client certificate and key is given without the other.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let roots = roots(files.ca_file.as_deref())?;
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("the ring provider supports TLS 1.2 and 1.3")
                .with_root_certificates(roots);
        let mut config = match (&files.cert_file, &files.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert_file), Some(key_file)) => {
                let chain = certificates(TlsFile::Cert, cert_file)?;
                let key = private_key(key_file)?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    let problem = format!("not the key of {}: {e}", cert_file.display());
                    file_error(TlsFile::Key, key_file, problem)
                })?
            }
            _ => return Err(TlsError::Unpaired),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The TLS handshake with the engine at `origin` over `tcp`, naming its host
    /// (sent as SNI for a DNS name; an IP address must be in the certificate).
    pub(crate) async fn connect(
        &self,
        origin: &Origin,
        tcp: TcpStream,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(origin.host())
            .map_err(|e| {
                let message = format!("{} is no TLS server name: {e}", origin.host());
                io::Error::new(io::ErrorKind::InvalidInput, message)
            })?
            .to_owned();
        self.connector.connect(name, tcp).await
    }
}

/// The system's certificate authorities and those of `ca_file`.
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = ca_file {
        for (at, cert) in certificates(TlsFile::Ca, path)?.into_iter().enumerate() {
            roots.add(cert).map_err(|e| {
                let problem = format!("certificate {} is no usable authority: {e}", at + 1);
                file_error(TlsFile::Ca, path, problem)
            })?;
        }
    }
    Ok(roots)
}

/// Every PEM certificate in `path`: at least one.
fn certificates(file: TlsFile, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_bounded(file, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(file, path, format!("not PEM: {e}")))?;
    if certificates.is_empty() {
        let problem = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)";
        return Err(file_error(file, path, problem.into()));
    }
    Ok(certificates)
}

/// The first PEM private key in `path`.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_bounded(TlsFile::Key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let problem = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned()
            }
            e => format!("not PEM: {e}"),
        };
        file_error(TlsFile::Key, path, problem)
    })
}

/// The file at `path`, at most [`MAX_PEM_BYTES`] of it.
fn read_bounded(file: TlsFile, path: &Path) -> Result<Vec<u8>, TlsError> {
    // Only a regular file (or a link to one): a FIFO or a device at the path would
    // block the read or never end it.
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(file_error(file, path, "not a regular file".into())),
        Err(e) => return Err(file_error(file, path, e.to_string())),
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| file_error(file, path, e.to_string()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        let problem = format!("larger than {MAX_PEM_BYTES} bytes");
        return Err(file_error(file, path, problem));
    }
    Ok(bytes)
}

fn file_error(file: TlsFile, path: &Path, problem: String) -> TlsError {
    TlsError::File {
        file,
        path: path.to_path_buf(),
        problem,
    }
}

/// Reads the decrypted bytes that have arrived into `buf`, as
/// [`Stream::poll_read_buf`](crate::h1::Stream) does.
pub(crate) fn poll_read_buf(
    tls: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let start = buf.len();
    buf.resize(start + READ_CHUNK.max(buf.capacity() - start), 0);
    let mut read = ReadBuf::new(&mut buf[start..]);
    let polled = Pin::new(&mut *tls).poll_read(cx, &mut read);
    let filled = read.filled().len();
    buf.truncate(start + filled);
    polled.map_ok(|()| filled)
}

/// Whether an idle TLS connection is usable: reading it would wait.
pub(crate) fn is_open(tls: &mut TlsStream<TcpStream>) -> bool {
    let mut probe = [0_u8; 1];
    let mut read = ReadBuf::new(&mut probe);
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(tls).poll_read(&mut cx, &mut read).is_pending()
}

/// Whether `error`, from the first read of a new connection, is the engine's TLS
/// alert: it refused the connection (say, a client certificate it requires was
/// missing or not trusted), so it never read the request.
pub(crate) fn refused(error: &io::Error) -> bool {
    error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::AlertReceived(_)))
}

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
