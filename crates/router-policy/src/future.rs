//! The boxed future the crate's object-safe traits return.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future, so [`Policy`](crate::Policy) and
/// [`CacheSource`](crate::CacheSource) stay object-safe and may await remote lookups.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
