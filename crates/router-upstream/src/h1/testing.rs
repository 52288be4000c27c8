//! Test support: a scripted engine over a real loopback socket, and a client
//! fetching from it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::{H1Client, H1Error};

/// What the scripted server does after writing an answer.
#[derive(Debug)]
pub(super) enum Then {
    /// Keeps the connection and reads the next request from it.
    KeepOpen,
    /// Closes the connection.
    Close,
    /// Once `go` fires, writes these bytes unasked on the idle connection, says so
    /// on `done`, and keeps the connection.
    Unsolicited {
        bytes: &'static [u8],
        go: oneshot::Receiver<()>,
        done: oneshot::Sender<()>,
    },
}

impl From<bool> for Then {
    fn from(close: bool) -> Self {
        if close { Self::Close } else { Self::KeepOpen }
    }
}

/// A server answering each request head it reads with the next scripted response,
/// then doing what the entry says. Counts connections.
pub(super) async fn scripted<R, T>(script: Vec<(R, T)>) -> (Arc<str>, Arc<AtomicUsize>)
where
    R: AsRef<[u8]> + Send + 'static,
    T: Into<Then> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority: Arc<str> = Arc::from(listener.local_addr().unwrap().to_string());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        let mut script = script.into_iter();
        'accept: while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            loop {
                let mut request = Vec::new();
                let mut byte = [0_u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut byte).await {
                        Ok(0) | Err(_) => continue 'accept,
                        Ok(n) => request.extend_from_slice(&byte[..n]),
                    }
                }
                let Some((response, then)) = script.next() else {
                    return;
                };
                socket.write_all(response.as_ref()).await.unwrap();
                match then.into() {
                    Then::KeepOpen => {}
                    Then::Close => continue 'accept,
                    Then::Unsolicited { bytes, go, done } => {
                        if go.await.is_ok() {
                            socket.write_all(bytes).await.unwrap();
                            let _ = done.send(());
                        }
                    }
                }
            }
        }
    });
    (authority, connections)
}

/// A client with a pool of up to 8 connections per engine.
pub(super) fn client() -> H1Client {
    H1Client::new(Duration::from_secs(5), Duration::from_secs(60), 8)
}

/// `GET /x`: the status and the whole body.
pub(super) async fn get(
    client: &H1Client,
    authority: &Arc<str>,
) -> Result<(StatusCode, Bytes), H1Error> {
    let response = client
        .request("GET", authority, "/x", &[], &Bytes::new())
        .await?;
    let status = response.status();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}
