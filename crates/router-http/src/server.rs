//! Serving: the listener (TCP_NODELAY on every accepted socket), the health checker,
//! and graceful shutdown that drains in-flight requests within a grace period.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{admin_router, router};
use crate::app::{AppContext, StartError};
use crate::config::{RouterConfig, ValidatedConfig};

/// A router serving on a bound address.
#[derive(Debug)]
pub struct RunningRouter {
    addr: SocketAddr,
    ctx: Arc<AppContext>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    /// The admin API's own address and server, when `admin.listen` is set.
    admin: Option<(SocketAddr, JoinHandle<()>)>,
}

impl RunningRouter {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin API's own address, when it has one (`admin.listen`).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(addr, _)| *addr)
    }

    /// The shared services.
    pub fn context(&self) -> &Arc<AppContext> {
        &self.ctx
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, then
    /// returns.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        drop(self.server.await);
        if let Some((_, admin)) = self.admin {
            drop(admin.await);
        }
    }
}

/// Validates `config`, builds the application, binds `config.listen` and starts
/// serving.
///
/// # Errors
/// See [`StartError`].
pub async fn start(config: RouterConfig) -> Result<RunningRouter, StartError> {
    start_validated(config.validate().map_err(StartError::Config)?).await
}

/// Builds the application from a validated configuration, binds its listen address
/// and starts serving.
///
/// # Errors
/// See [`StartError`].
pub async fn start_validated(config: ValidatedConfig) -> Result<RunningRouter, StartError> {
    let grace = config.shutdown_grace;
    let listen = config.listen;
    let admin_listen = config.admin_listen;
    let ctx = AppContext::new(config).await?;
    let (listener, addr) = bind(listen).await?;
    let (stop, stopped) = watch::channel(false);
    let admin = match admin_listen {
        Some(listen) => {
            let (listener, addr) = bind(listen).await?;
            let app = admin_router(Arc::clone(&ctx));
            let mut shutdown = stopped.clone();
            let server = tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    drop(shutdown.wait_for(|s| *s).await);
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "admin server failed");
                }
            });
            tracing::info!(%addr, "admin API listening");
            Some((addr, server))
        }
        None => None,
    };
    let health = ctx.fleet.spawn_health_checks();
    let app = router(Arc::clone(&ctx), admin.is_none());
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "setting TCP_NODELAY failed");
        }
    });
    let server = tokio::spawn(async move {
        let mut draining = stopped.clone();
        let mut shutdown = stopped;
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            drop(shutdown.wait_for(|s| *s).await);
        });
        let deadline = async move {
            drop(draining.wait_for(|s| *s).await);
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            result = serve => if let Err(e) = result {
                tracing::error!(error = %e, "server failed");
            },
            () = deadline => tracing::warn!(?grace, "grace period over; closing remaining connections"),
        }
        drop(health);
    });
    tracing::info!(%addr, "switchyard listening");
    Ok(RunningRouter {
        addr,
        ctx,
        stop,
        server,
        admin,
    })
}

/// A listener on `addr` and the address it got.
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen = |source| StartError::Listen { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    Ok((listener, bound))
}
