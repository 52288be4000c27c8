//! An engine's time per output token, measured on a streamed answer as it is relayed:
//! the time from the first event to the last, over the events after the first. An
//! event is one `data:` field of server-sent events, also when a frame boundary splits
//! it (the closing `data: [DONE]` left out); engines stream a token an event at their
//! default stream interval, plus a finishing and perhaps a usage event, which is why
//! short answers are not measured.

use std::time::Duration;

use router_state::EngineId;
use tokio::time::Instant;

/// The fewest events after the first that make a measurement: with fewer, the
/// finishing and usage events weigh too much, and scheduling more than decoding.
const MIN_EVENTS: u64 = 16;
const EVENT: &[u8] = b"data:";
const DONE: [&[u8]; 2] = [b"data: [DONE]", b"data:[DONE]"];

/// The measurement of one answer, from the engine that generates it.
#[derive(Debug)]
pub(crate) struct TpotMeter {
    /// The engine measured.
    pub(crate) engine: EngineId,
    first: Option<Instant>,
    last: Option<Instant>,
    /// `data:` fields in the frames after the first frame that had any.
    fields: u64,
    /// Closing `[DONE]` fields.
    dones: u64,
    /// The end of the frames so far, for a field a frame boundary splits.
    tail: Vec<u8>,
}

impl TpotMeter {
    /// A meter of `engine`'s answer.
    pub(crate) fn new(engine: EngineId) -> Self {
        Self {
            engine,
            first: None,
            last: None,
            fields: 0,
            dones: 0,
            tail: Vec::new(),
        }
    }

    /// Notes a data frame of the answer, arriving at `now`.
    pub(crate) fn frame(&mut self, data: &[u8], now: Instant) {
        let (fields, dones) = self.count_fields(data);
        self.dones += dones;
        if fields == 0 {
            return;
        }
        if self.first.is_none() {
            self.first = Some(now);
        } else {
            self.fields += fields;
            self.last = Some(now);
        }
    }

    /// Events after the first frame, `[DONE]` left out.
    fn events(&self) -> u64 {
        self.fields.saturating_sub(self.dones)
    }

    /// The time per token measured, when enough events came after the first.
    pub(crate) fn per_token(&self) -> Option<Duration> {
        let (first, last) = (self.first?, self.last?);
        let events = self.events();
        (events >= MIN_EVENTS).then(|| {
            last.saturating_duration_since(first) / u32::try_from(events).unwrap_or(u32::MAX)
        })
    }

    /// The `data:` fields and the closing `[DONE]` fields ending in `data` (one may
    /// have begun in the frames before): those begun in the kept end of the frames
    /// before, read from a seam of it and `data`'s head, then those wholly in `data`.
    fn count_fields(&mut self, data: &[u8]) -> (u64, u64) {
        let keep = DONE[0].len() - 1;
        let carried = self.tail.len();
        let mut seam = std::mem::take(&mut self.tail);
        seam.extend_from_slice(&data[..data.len().min(keep)]);
        let count = |needle: &[u8]| {
            let across = seam
                .windows(needle.len())
                .enumerate()
                .filter(|(at, w)| *at < carried && at + needle.len() > carried && *w == needle)
                .count();
            let within = data.windows(needle.len()).filter(|w| *w == needle).count();
            (across + within) as u64
        };
        let counted = (count(EVENT), DONE.iter().map(|d| count(d)).sum());
        if data.len() >= keep {
            seam.clear();
            seam.extend_from_slice(&data[data.len() - keep..]);
        } else {
            seam.drain(..seam.len().saturating_sub(keep));
        }
        self.tail = seam;
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u32) -> Vec<u8> {
        format!("data: {{\"t\": {n}}}\n\n").into_bytes()
    }

    #[test]
    fn the_pace_is_the_time_after_the_first_event_over_the_events_after_it() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut meter = TpotMeter::new(EngineId::from("e"));
        meter.frame(&[event(0), event(1)].concat(), at(0));
        assert_eq!(meter.per_token(), None, "one frame says nothing of a pace");
        meter.frame(b": keep-alive\n\n", at(5));
        for n in 2..17 {
            meter.frame(&event(n), at(u64::from(n) * 10));
        }
        assert_eq!(meter.per_token(), None, "fifteen events are too few");
        meter.frame(&[event(17), b"data: [DONE]\n\n".to_vec()].concat(), at(170));
        assert_eq!(
            meter.per_token(),
            Some(Duration::from_micros(10_625)),
            "170 ms over sixteen events; the comment and [DONE] are none"
        );
    }

    #[test]
    fn an_event_split_between_frames_counts_once_wherever_it_is_cut() {
        let stream: Vec<u8> = (0..20)
            .flat_map(event)
            .chain(b"data: [DONE]\n\n".iter().copied())
            .collect();
        for cut in 1..stream.len() {
            let mut meter = TpotMeter::new(EngineId::from("e"));
            let start = Instant::now();
            meter.frame(&event(99), start);
            meter.frame(&stream[..cut], start + Duration::from_millis(1));
            meter.frame(&stream[cut..], start + Duration::from_millis(21));
            assert_eq!(meter.events(), 20, "cut at {cut}");
        }
    }
}
