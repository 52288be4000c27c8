//! KV-cache events: the wire format engines publish, and (next) the prefix index fed
//! from it.

mod wire;

pub use wire::{
    BatchError, BlockRemoved, BlockStored, EventError, KvBatch, KvEvent, Tier, decode_batch,
};
