//! Test support: a scripted engine over a real loopback socket, and a client
//! fetching from it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;

use super::{H1Client, H1Error};
use crate::url::Origin;

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

/// A server answering each request head it reads, on whichever connection, with the
/// next scripted response, then doing what the entry says. Each connection is served
/// in a task of its own, so a connection held open never keeps another waiting. Once
/// the script is used up, the server stops: the listener and every connection close.
/// Counts connections.
pub(super) async fn scripted<R, T>(script: Vec<(R, T)>) -> (Origin, Arc<AtomicUsize>)
where
    R: AsRef<[u8]> + Send + 'static,
    T: Into<Then> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = plain(listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        let script = Arc::new(Mutex::new(script.into_iter()));
        let used_up = Arc::new(Notify::new());
        // Dropped with this task, which aborts every connection's task.
        let mut served = JoinSet::new();
        loop {
            let socket = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((socket, _)) => socket,
                    Err(_) => return,
                },
                () = used_up.notified() => return,
            };
            counted.fetch_add(1, Ordering::SeqCst);
            served.spawn(serve(socket, Arc::clone(&script), Arc::clone(&used_up)));
        }
    });
    (origin, connections)
}

/// The plain `http://` origin of `address`.
pub(super) fn plain(address: SocketAddr) -> Origin {
    Origin::of(&format!("http://{address}")).expect("an engine URL")
}

/// One connection of [`scripted`]: reads request heads until the client closes, the
/// script closes the connection, or the script is used up (then wakes `used_up`).
async fn serve<R, T>(
    mut socket: TcpStream,
    script: Arc<Mutex<std::vec::IntoIter<(R, T)>>>,
    used_up: Arc<Notify>,
) where
    R: AsRef<[u8]>,
    T: Into<Then>,
{
    loop {
        let mut request = Vec::new();
        let mut byte = [0_u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&byte[..n]),
            }
        }
        let Some((response, then)) = script.lock().next() else {
            used_up.notify_one();
            return;
        };
        socket.write_all(response.as_ref()).await.unwrap();
        match then.into() {
            Then::KeepOpen => {}
            Then::Close => return,
            Then::Unsolicited { bytes, go, done } => {
                if go.await.is_ok() {
                    socket.write_all(bytes).await.unwrap();
                    let _ = done.send(());
                }
            }
        }
    }
}

/// A client with a pool of up to 8 connections per engine.
pub(super) fn client() -> H1Client {
    H1Client::new(Duration::from_secs(5), Duration::from_secs(60), 8)
}

/// `GET /x`: the status and the whole body.
pub(super) async fn get(
    client: &H1Client,
    origin: &Origin,
) -> Result<(StatusCode, Bytes), H1Error> {
    let response = client
        .request("GET", origin, "/x", &[], &Bytes::new())
        .await?;
    let status = response.status();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}
