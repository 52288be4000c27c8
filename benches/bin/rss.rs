//! The process's resident set size, for the memory measurements.

/// Resident set size in bytes, from `/proc/self/statm`.
pub(crate) fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("a resident page count");
    pages * 4096
}
