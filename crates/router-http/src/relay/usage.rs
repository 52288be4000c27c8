//! The usage an engine's answer reports, read from the body as it is relayed: the
//! last `"prompt_tokens": N`, `"cached_tokens": N` and `"completion_tokens": N`
//! (OpenAI's `usage` and its `prompt_tokens_details`, SGLang's `meta_info`), also
//! when a frame boundary splits them. Nothing is parsed but these digits, and at most a few dozen bytes are kept
//! between frames.

use std::sync::LazyLock;

use memchr::memmem::Finder;

/// What every key ends with; the bytes before it tell which key it is.
const KEY_END: &[u8] = b"_tokens\":";
/// The searcher for [`KEY_END`], built once.
static KEY_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY_END));
/// The longest key, `"completion_tokens":`.
const KEY_BYTES: usize = 20;
/// What a value may take after its key: spaces and 20 digits.
const VALUE_BYTES: usize = 24;
/// The largest count taken: an engine's answer counts no more tokens than a 32-bit
/// count holds, so a larger number is not a count (and cannot wrap a counter).
const MAX_COUNT: u64 = u32::MAX as u64;

/// The bytes kept from the end of a frame: a key and its value split by a frame
/// boundary are found in them and the next frame's start.
const KEEP: usize = KEY_BYTES + VALUE_BYTES;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct UsageScan {
    prompt: Option<u64>,
    cached: Option<u64>,
    completion: Option<u64>,
    /// The end of the frames so far (its first `tail_len` bytes).
    tail: [u8; KEEP],
    tail_len: usize,
}

impl Default for UsageScan {
    fn default() -> Self {
        Self {
            prompt: None,
            cached: None,
            completion: None,
            tail: [0; KEEP],
            tail_len: 0,
        }
    }
}

impl UsageScan {
    /// The last prompt-token count the answer reported.
    pub(crate) fn prompt_tokens(&self) -> Option<u64> {
        self.prompt
    }

    /// The last cached-token count the answer reported.
    pub(crate) fn cached_tokens(&self) -> Option<u64> {
        self.cached
    }

    /// The last completion-token count the answer reported.
    pub(crate) fn completion_tokens(&self) -> Option<u64> {
        self.completion
    }

    /// Scans one frame: the seam with the end of the frames before it, then the rest.
    pub(crate) fn scan(&mut self, data: &[u8]) {
        let mut seam = [0u8; 2 * KEEP];
        let head = &data[..data.len().min(KEEP)];
        let seam_len = self.tail_len + head.len();
        seam[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        seam[self.tail_len..seam_len].copy_from_slice(head);
        if self.tail_len > 0 {
            self.find(&seam[..seam_len]);
        }
        let last = if data.len() > KEEP {
            self.find(data);
            &data[data.len() - KEEP..]
        } else {
            if self.tail_len == 0 {
                self.find(data);
            }
            &seam[seam_len.saturating_sub(KEEP)..seam_len]
        };
        self.tail[..last.len()].copy_from_slice(last);
        self.tail_len = last.len();
    }

    fn find(&mut self, data: &[u8]) {
        for found in KEY_FINDER.find_iter(data) {
            let name = &data[..found];
            let slot = if name.ends_with(b"\"cached") {
                &mut self.cached
            } else if name.ends_with(b"\"prompt") {
                &mut self.prompt
            } else if name.ends_with(b"\"completion") {
                &mut self.completion
            } else {
                continue;
            };
            let value = data[found + KEY_END.len()..].trim_ascii_start();
            let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == value.len() {
                // The value may go on in the next frame: the seam with it reads it whole.
                continue;
            }
            if let Some(n) = std::str::from_utf8(&value[..digits])
                .ok()
                .and_then(|d| d.parse::<u64>().ok())
                .filter(|n| *n <= MAX_COUNT)
            {
                *slot = Some(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(frames: &[&[u8]]) -> (Option<u64>, Option<u64>) {
        let usage = scan(frames);
        (usage.prompt_tokens(), usage.cached_tokens())
    }

    fn scan(frames: &[&[u8]]) -> UsageScan {
        let mut usage = UsageScan::default();
        for frame in frames {
            usage.scan(frame);
        }
        usage
    }

    #[test]
    fn usage_is_found_wherever_a_frame_boundary_falls() {
        let body: &[u8] = br#"{"usage":{"prompt_tokens":40,"completion_tokens":   123456789,"prompt_tokens_details":{"cached_tokens": 1234567},"total_tokens":9}}"#;
        let whole = (Some(40), Some(1_234_567), Some(123_456_789));
        let found = |usage: UsageScan| {
            (
                usage.prompt_tokens(),
                usage.cached_tokens(),
                usage.completion_tokens(),
            )
        };
        assert_eq!(found(scan(&[body])), whole);
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(found(scan(&[a, b])), whole, "cut at {cut}");
        }
        for size in 1..8 {
            let frames: Vec<&[u8]> = body.chunks(size).collect();
            assert_eq!(found(scan(&frames)), whole, "frames of {size} bytes");
        }
    }

    #[test]
    fn the_last_value_counts_and_what_is_not_a_count_is_skipped() {
        let stream: &[&[u8]] = &[
            b"data: {\"choices\":[]}\n\n",
            b"data: {\"meta_info\":{\"prompt_tokens\":70,\"cached_tokens\":16}}\n\n",
            b"data: {\"usage\":{\"prompt_tokens\":80,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n",
            b"data: [DONE]\n\n",
        ];
        assert_eq!(scanned(stream), (Some(80), Some(48)));
        assert_eq!(scanned(&[b"{\"cached_tokens\":null}"]), (None, None));
        assert_eq!(
            scanned(&[b"{\"cached_tokens\":99999999999999999999999}"]),
            (None, None)
        );
        assert_eq!(
            scanned(&[b"{\"cached_tokens\":4294967296,\"prompt_tokens\":4294967295}"]),
            (Some(4_294_967_295), None),
            "a count over 32 bits is not taken"
        );
        assert_eq!(scanned(&[b"{\"usage\":{}}"]), (None, None));
        assert_eq!(
            scanned(&[b"{\"cached_tokens\":4294", b"9672960}"]),
            (None, None),
            "the start of a value too large is not taken either"
        );
        let other = scan(&[b"{\"total_tokens\":5,\"text\":\"\\\"cached_tokens\\\":9\"}"]);
        assert_eq!(
            (
                other.prompt_tokens(),
                other.cached_tokens(),
                other.completion_tokens()
            ),
            (None, None, None),
            "other keys, and a key quoted inside generated text, are not counts"
        );
    }
}
