//! Serving: the listeners (the public one, and the admin API's own when it has one),
//! the health checker, and graceful shutdown that drains in-flight requests within a
//! grace period.

use std::net::SocketAddr;
use std::sync::Arc;

use router_config::RouterConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{admin_router, probe_router, router};
use crate::app::{AppContext, StartError};
use crate::connections::Apps;
use crate::validated::ValidatedConfig;

/// A router serving on a bound address.
#[derive(Debug)]
pub struct RunningRouter {
    addr: SocketAddr,
    ctx: Arc<AppContext>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    /// The admin API's own address and server, when `admin.listen` is set.
    admin: Option<(SocketAddr, JoinHandle<()>)>,
    /// The endpoint picker's address and server, when `picker` is set.
    picker: Option<(SocketAddr, JoinHandle<()>)>,
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

    /// The endpoint picker's address, when it is served (`picker`).
    pub fn picker_addr(&self) -> Option<SocketAddr> {
        self.picker.as_ref().map(|(addr, _)| *addr)
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
        if let Some((_, picker)) = self.picker {
            drop(picker.await);
        }
        if let Some(spans) = self.ctx.spans.clone() {
            // Exports what is queued; the exporter blocks.
            drop(tokio::task::spawn_blocking(move || spans.shutdown()).await);
        }
    }
}

/// Validates `config`, builds the application, binds `config.listen` and starts
/// serving.
///
/// # Errors
/// See [`StartError`].
pub async fn start(config: RouterConfig) -> Result<RunningRouter, StartError> {
    start_validated(ValidatedConfig::validate(config).map_err(StartError::Config)?).await
}

/// Builds the application from a validated configuration, binds its listen address
/// and starts serving.
///
/// # Errors
/// See [`StartError`].
pub async fn start_validated(config: ValidatedConfig) -> Result<RunningRouter, StartError> {
    let grace = config.shutdown_grace;
    let listen = config.listen;
    #[cfg(feature = "kubernetes")]
    let (kubernetes, objectives) = (config.kubernetes.clone(), config.objectives_from_cluster);
    let admin_listen = config.admin_listen;
    #[cfg(feature = "picker")]
    let picker = config.picker.clone();
    let client = config.client;
    let ctx = AppContext::new(config).await?;
    let (listener, addr) = bind(listen).await?;
    let (stop, stopped) = watch::channel(false);
    let admin = match admin_listen {
        Some(listen) => {
            let (listener, addr) = bind(listen).await?;
            let app = admin_router(Arc::clone(&ctx));
            let server = tokio::spawn(crate::connections::serve(
                listener,
                Apps {
                    full: app,
                    probes: None,
                },
                client,
                stopped.clone(),
                grace,
            ));
            tracing::info!(%addr, "admin API listening");
            Some((addr, server))
        }
        None => None,
    };
    #[cfg(feature = "picker")]
    let picker = match picker {
        Some(settings) => {
            let (listener, addr) = bind(settings.listen).await?;
            let server = tokio::spawn(crate::api::picker::serve(
                Arc::clone(&ctx),
                listener,
                settings,
                stopped.clone(),
                grace,
            ));
            tracing::info!(%addr, "endpoint picker (ext_proc) listening");
            Some((addr, server))
        }
        None => None,
    };
    #[cfg(not(feature = "picker"))]
    let picker = None;
    let health = ctx.fleet.spawn_health_checks();
    #[cfg(feature = "kubernetes")]
    let discovery = match kubernetes {
        Some(mut settings) => {
            if objectives {
                let models = settings.pools.iter().map(|pool| pool.model.clone());
                settings.objectives = Some(ctx.objectives.follow(models));
            }
            Some(
                router_fleet::kubernetes::spawn_discovery(Arc::clone(&ctx.fleet), settings)
                    .map_err(|e| {
                        StartError::Config(vec![router_policy::ConfigError::at(
                            "discovery.kubernetes",
                            e,
                        )])
                    })?,
            )
        }
        None => None,
    };
    let apps = Apps {
        full: router(Arc::clone(&ctx), admin.is_none()),
        probes: Some(probe_router(Arc::clone(&ctx))),
    };
    let server = tokio::spawn(async move {
        crate::connections::serve(listener, apps, client, stopped, grace).await;
        drop(health);
        #[cfg(feature = "kubernetes")]
        drop(discovery);
    });
    tracing::info!(%addr, "switchyard listening");
    Ok(RunningRouter {
        addr,
        ctx,
        stop,
        server,
        admin,
        picker,
    })
}

/// A listener on `addr` and the address it got.
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen = |problem| StartError::Listen { addr, problem };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let bound = listener.local_addr().map_err(listen)?;
    Ok((listener, bound))
}
