//! The tenant ledger: caps, forgetting, the overflow entry and exactness under
//! concurrency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{OverCap, TenantLedger};
use crate::settings::LedgerSettings;

#[test]
fn a_cap_refuses_beyond_it_and_frees_on_drop() {
    let ledger = TenantLedger::new(LedgerSettings::default());
    let first = ledger.try_acquire("a", Some(2)).unwrap();
    let second = ledger.try_acquire("a", Some(2)).unwrap();
    assert_eq!(
        ledger.try_acquire("a", Some(2)).unwrap_err(),
        OverCap {
            in_flight: 2,
            cap: 2
        }
    );
    // Another tenant is counted apart; no cap means none.
    let other = ledger.try_acquire("b", None).unwrap();
    assert_eq!(ledger.in_flight("a"), 2);
    assert_eq!(ledger.in_flight("b"), 1);
    drop(second);
    let third = ledger.try_acquire("a", Some(2)).unwrap();
    drop((first, third, other));
    assert_eq!(ledger.in_flight("a"), 0);
    assert_eq!(ledger.tracked(), 0);
}

#[test]
fn a_zero_cap_refuses_everything() {
    let ledger = TenantLedger::new(LedgerSettings::default());
    assert_eq!(
        ledger.try_acquire("a", Some(0)).unwrap_err(),
        OverCap {
            in_flight: 0,
            cap: 0
        }
    );
    assert_eq!(ledger.tracked(), 0);
}

#[test]
fn tenants_beyond_max_tracked_share_the_overflow_entry_without_caps() {
    let ledger = TenantLedger::new(LedgerSettings { max_tracked: 2 });
    let a = ledger.try_acquire("a", Some(1)).unwrap();
    let b = ledger.try_acquire("b", Some(1)).unwrap();
    let c1 = ledger.try_acquire("c", Some(1)).unwrap();
    let c2 = ledger.try_acquire("c", Some(1)).unwrap();
    assert!(!a.is_overflow() && !b.is_overflow());
    assert!(c1.is_overflow() && c2.is_overflow());
    assert_eq!(ledger.tracked(), 2);
    assert_eq!(ledger.overflow_in_flight(), 2);
    assert_eq!(ledger.in_flight("c"), 0);
    // A tracked tenant keeps its cap.
    assert!(ledger.try_acquire("a", Some(1)).is_err());
    drop((c1, c2, a));
    assert_eq!(ledger.overflow_in_flight(), 0);
    // a was forgotten, which made room to track c by name.
    let c = ledger.try_acquire("c", Some(1)).unwrap();
    assert!(!c.is_overflow());
    assert!(ledger.try_acquire("c", Some(1)).is_err());
    drop((b, c));
    assert_eq!(ledger.tracked(), 0);
}

#[test]
fn a_tenant_always_named_keeps_its_cap_however_many_others_are_tracked() {
    let ledger = TenantLedger::new(LedgerSettings { max_tracked: 1 }).always_naming(["vip".into()]);
    let other = ledger.try_acquire("other-team", Some(1)).unwrap();
    let vip = ledger.try_acquire("vip", Some(1)).unwrap();
    assert!(!vip.is_overflow(), "counted by name beyond max_tracked");
    assert_eq!(
        ledger.try_acquire("vip", Some(1)).unwrap_err(),
        OverCap {
            in_flight: 1,
            cap: 1
        }
    );
    assert!(ledger.try_acquire("third", Some(1)).unwrap().is_overflow());
    drop((other, vip));
    assert_eq!(ledger.tracked(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cap_holds_under_contention() {
    const CAP: u64 = 4;
    let ledger = TenantLedger::new(LedgerSettings::default());
    let current = Arc::new(AtomicU64::new(0));
    let high = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (ledger, current, high) = (ledger.clone(), Arc::clone(&current), Arc::clone(&high));
            tokio::spawn(async move {
                let mut held = 0u32;
                for _ in 0..500 {
                    if let Ok(guard) = ledger.try_acquire("t", Some(CAP)) {
                        let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                        high.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        current.fetch_sub(1, Ordering::SeqCst);
                        drop(guard);
                        held += 1;
                    }
                    tokio::task::yield_now().await;
                }
                held
            })
        })
        .collect();
    let mut held = 0;
    for task in tasks {
        held += task.await.unwrap();
    }
    assert!(held > 0);
    assert!(high.load(Ordering::SeqCst) <= CAP);
    assert_eq!(ledger.in_flight("t"), 0);
    assert_eq!(ledger.tracked(), 0);
}
