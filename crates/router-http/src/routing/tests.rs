use std::num::NonZeroU32;
use std::time::Duration;

use router_flow::{DisciplineSettings, RoomSettings, WaitingRoom};

use super::*;

fn room() -> Arc<WaitingRoom> {
    WaitingRoom::new(RoomSettings {
        max_wait: Duration::from_secs(60),
        discipline: DisciplineSettings {
            bands: 1,
            starvation_limit: 16,
            capacity: 8,
        },
        tries_per_pass: 8,
    })
    .unwrap()
}

// A request that resolved a model's route before a reload replaced it may enter the
// old queue after the reload: capacity events still reach it there.
#[tokio::test(start_paused = true)]
async fn a_queue_a_reload_replaced_hears_capacity_events_while_it_is_held() {
    let rooms = Rooms::default();
    let (old, new) = (room(), room());
    rooms.serve(vec![Arc::clone(&old)]);
    rooms.serve(vec![Arc::clone(&new)]);
    let mut ticket = old.enter(0, "t".into(), NonZeroU32::MIN, 0).unwrap();
    ticket.turn().await.unwrap();
    ticket.failed();
    assert!(!ticket.holds_turn());
    rooms.capacity_freed();
    assert!(ticket.holds_turn(), "the replaced queue heard the event");
    drop(ticket);
    let weak = Arc::downgrade(&old);
    drop(old);
    assert!(weak.upgrade().is_none(), "the list does not keep it alive");
    rooms.serve(vec![Arc::clone(&new)]);
    assert!(
        rooms.0.load().retired.is_empty(),
        "and forgets it once gone"
    );
}
