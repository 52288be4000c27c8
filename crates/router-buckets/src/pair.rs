//! The prefill and decode engines of a PD bucket that can hand a request's KV cache
//! over: the bucket offers its prefill policy only the prefill engines some decode
//! candidate can take the KV cache of, then its decode policy only the decode engines
//! that can take the picked prefill engine's. So both engines of a pair agree on what
//! they report of the hand-over ([`PdProfile`]), and a bucket whose engines cannot
//! pair at all is passed over with [`PickError::NoCompatiblePair`].

use std::sync::Arc;

use router_policy::{MAX_UNPAIRED_NAMED, Observation, PickError, PickRequest, Unpaired};
use router_state::{Engine, PdProfile, Role};

use crate::group::Offer;

/// Leaves out of `prefills` the engines none of `decodes` can pair with, recording
/// each with its mismatch against the first decode engine. All stay when `decodes`
/// is empty (the decode pick then reports the missing stage); none staying of some
/// is [`PickError::NoCompatiblePair`].
pub(crate) fn pairable_prefills(
    prefills: Offer,
    decodes: &[Arc<Engine>],
    request: &PickRequest<'_>,
) -> Offer {
    let Some(first) = decodes.first() else {
        return prefills;
    };
    let profiles = distinct_profiles(decodes);
    let pairs = |prefill: &Arc<Engine>| {
        profiles
            .iter()
            .any(|decode| prefill.pd_profile().mismatch(decode).is_none())
    };
    if prefills.candidates.iter().all(pairs) {
        return prefills;
    }
    let (kept, left_out): (Vec<_>, Vec<_>) =
        prefills.candidates.iter().cloned().partition(|p| pairs(p));
    let mut unpaired = Vec::new();
    for prefill in &left_out {
        if let Some(with_first) = pair(prefill, first) {
            observe(request, &with_first);
        }
        let room = MAX_UNPAIRED_NAMED.saturating_sub(unpaired.len());
        unpaired.extend(
            decodes
                .iter()
                .take(room)
                .filter_map(|decode| pair(prefill, decode)),
        );
    }
    offer(
        kept,
        prefills.none,
        unpaired,
        left_out.len() * decodes.len(),
    )
}

/// Leaves out of `decodes` the engines that cannot take `prefill`'s KV cache,
/// recording each with its mismatch; none staying of some is
/// [`PickError::NoCompatiblePair`].
pub(crate) fn decodes_for(prefill: &Engine, decodes: Offer, request: &PickRequest<'_>) -> Offer {
    let pairs = |decode: &Arc<Engine>| prefill.pd_profile().mismatch(decode.pd_profile()).is_none();
    if decodes.candidates.iter().all(pairs) {
        return decodes;
    }
    let (kept, left_out): (Vec<_>, Vec<_>) =
        decodes.candidates.iter().cloned().partition(|d| pairs(d));
    let mut unpaired: Vec<Unpaired> = left_out
        .iter()
        .filter_map(|decode| pair(prefill, decode))
        .collect();
    for pair in &unpaired {
        observe(request, pair);
    }
    let pairs = unpaired.len();
    unpaired.truncate(MAX_UNPAIRED_NAMED);
    offer(kept, decodes.none, unpaired, pairs)
}

/// The candidates kept; when none is, of some, the failure names the pairs.
fn offer(kept: Vec<Arc<Engine>>, none: PickError, unpaired: Vec<Unpaired>, pairs: usize) -> Offer {
    let none = if kept.is_empty() && pairs > 0 {
        PickError::NoCompatiblePair { unpaired, pairs }
    } else {
        none
    };
    Offer {
        candidates: Arc::new(kept),
        none,
    }
}

/// The pair of `prefill` and `decode` and what they disagree on, if anything.
fn pair(prefill: &Engine, decode: &Engine) -> Option<Unpaired> {
    let mismatch = prefill.pd_profile().mismatch(decode.pd_profile())?;
    Some(Unpaired {
        prefill: prefill.id().clone(),
        decode: decode.id().clone(),
        mismatch,
    })
}

/// Records that the engine of the request's stage in `pair` was left out.
fn observe(request: &PickRequest<'_>, pair: &Unpaired) {
    let (engine, with) = match request.stage {
        Role::Decode => (&pair.decode, &pair.prefill),
        _ => (&pair.prefill, &pair.decode),
    };
    request.observe(|| Observation::Unpaired {
        bucket: request.bucket_id.to_owned(),
        stage: request.stage,
        engine: engine.clone(),
        with: with.clone(),
        mismatch: pair.mismatch.clone(),
    });
}

/// The profiles `engines` report, each once (a fleet has few).
fn distinct_profiles(engines: &[Arc<Engine>]) -> Vec<&PdProfile> {
    let mut profiles: Vec<&PdProfile> = Vec::new();
    for engine in engines {
        if !profiles.contains(&engine.pd_profile()) {
            profiles.push(engine.pd_profile());
        }
    }
    profiles
}
