//! Free local ports for tests of engines with several ranks.

use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::ops::Range;

/// The lowest port the search considers: below it sit well-known services.
const LOWEST: u32 = 10_000;

/// The first port of each of `N` ranges of consecutive free ports, `sizes[i]` ports
/// long: one block of them all, found free at once (every port bound together) and cut
/// in order, so no two ranges overlap. For tests of engines with several ranks,
/// whose ZeroMQ sockets bind consecutive ports from a fixed base.
///
/// The search runs outside the kernel's ephemeral range, so the ports that every
/// connection and every `bind(0)` of other tests take cannot crowd it. It starts at a
/// random port, so tests running at once look in different places, and walks on past
/// each port it finds taken, so it gives up only when no block is free anywhere.
///
/// # Panics
/// When no block of `sizes`' total is free outside the ephemeral range.
pub fn free_port_ranges<const N: usize>(sizes: [u16; N]) -> [u16; N] {
    let total: u32 = sizes.iter().map(|&size| u32::from(size)).sum();
    let regions = searchable(ephemeral_range());
    let span: u32 = regions.iter().map(|region| region.len() as u32).sum();
    let Some(first) = find_block(&regions, random_below(span.max(1)), total) else {
        panic!("no {total} consecutive free ports outside the ephemeral range");
    };
    cut(first, sizes)
}

/// The block from `first` cut in order into ranges `sizes` long: their first ports.
/// In u32, as the block may end at 65,536, one past the last port.
fn cut<const N: usize>(first: u16, sizes: [u16; N]) -> [u16; N] {
    let mut next = u32::from(first);
    sizes.map(|size| {
        let start = next;
        next += u32::from(size);
        u16::try_from(start).expect("a range starts at a port of the block")
    })
}

/// The first port of `total` consecutive ports in one of `regions`, all free at
/// once, searching from the `start`-th port of the regions on and round to it again.
fn find_block(regions: &[Range<u32>], start: u32, total: u32) -> Option<u16> {
    let span: u32 = regions.iter().map(|region| region.len() as u32).sum();
    let mut walked = 0;
    while walked < span {
        let (region, first) = locate(regions, (start + walked) % span);
        let mut taken = None;
        if first + total <= region.end {
            let mut held = Vec::with_capacity(total as usize);
            for port in first..first + total {
                match TcpListener::bind(("127.0.0.1", port as u16)) {
                    Ok(listener) => held.push(listener),
                    Err(_) => {
                        taken = Some(port);
                        break;
                    }
                }
            }
            if taken.is_none() {
                return Some(first as u16);
            }
        }
        // Past the taken port, or to the next region when the block overran this one.
        walked += match taken {
            Some(port) => port + 1 - first,
            None => region.end - first,
        };
    }
    None
}

/// The kernel's ephemeral port range, where `bind(0)` and outgoing connections draw.
fn ephemeral_range() -> Range<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u32>);
            let low = bounds.next()?.ok()?;
            let high = bounds.next()?.ok()?;
            Some(low..high + 1)
        })
        .unwrap_or(32_768..61_000)
}

/// The port ranges from [`LOWEST`] up that lie outside `ephemeral`.
fn searchable(ephemeral: Range<u32>) -> Vec<Range<u32>> {
    [
        LOWEST..ephemeral.start.max(LOWEST),
        ephemeral.end.max(LOWEST)..65_536,
    ]
    .into_iter()
    .filter(|region| !region.is_empty())
    .collect()
}

/// The region holding the `offset`-th searchable port, and that port.
fn locate(regions: &[Range<u32>], mut offset: u32) -> (Range<u32>, u32) {
    for region in regions {
        let len = region.len() as u32;
        if offset < len {
            return (region.clone(), region.start + offset);
        }
        offset -= len;
    }
    unreachable!("offset within the regions' span")
}

/// A number below `bound`, different in each process and call.
fn random_below(bound: u32) -> u32 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    (hasher.finish() % u64::from(bound)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_searchable_ports_leave_out_the_ephemeral_range() {
        assert_eq!(
            searchable(32_768..61_000),
            vec![LOWEST..32_768, 61_000..65_536]
        );
        assert_eq!(searchable(1_024..65_536), Vec::<Range<u32>>::new());
        assert_eq!(searchable(1_024..40_000), vec![40_000..65_536]);
    }

    #[test]
    fn an_offset_maps_to_its_region_and_port() {
        let regions = [10..20, 30..35];
        assert_eq!(locate(&regions, 0), (10..20, 10));
        assert_eq!(locate(&regions, 9), (10..20, 19));
        assert_eq!(locate(&regions, 10), (30..35, 30));
        assert_eq!(locate(&regions, 14), (30..35, 34));
    }

    #[test]
    fn ranges_are_consecutive_free_and_outside_the_ephemeral_range() {
        let ephemeral = ephemeral_range();
        let [a, b] = free_port_ranges([6, 6]);
        assert_eq!(b, a + 6);
        for port in a..a + 12 {
            assert!(!ephemeral.contains(&u32::from(port)), "{port}");
            TcpListener::bind(("127.0.0.1", port)).expect("the block is free");
        }
    }

    #[test]
    fn a_block_ending_at_the_last_port_is_cut() {
        assert_eq!(cut(65_530, [3, 3]), [65_530, 65_533]);
        assert_eq!(cut(65_535, [1]), [65_535]);
        assert_eq!(cut(100, [2, 0, 5]), [100, 102, 102]);
    }

    #[test]
    fn a_search_starting_on_a_taken_port_hands_out_another() {
        let held = TcpListener::bind("127.0.0.1:0").expect("binds");
        let taken = u32::from(held.local_addr().expect("addr").port());
        let region = taken.saturating_sub(32)..(taken + 32).min(65_536);
        let start = taken - region.start;
        let first = find_block(std::slice::from_ref(&region), start, 1).expect("a free port");
        assert_ne!(u32::from(first), taken);
        assert!(region.contains(&u32::from(first)));
        let only_taken = taken..taken + 1;
        assert_eq!(find_block(std::slice::from_ref(&only_taken), 0, 1), None);
    }

    #[test]
    fn a_block_never_runs_past_its_region() {
        // A free port and the region of it alone: a block of two would take the port
        // after it, outside the region, were it not refused.
        let port = u32::from(
            TcpListener::bind("127.0.0.1:0")
                .expect("binds")
                .local_addr()
                .expect("addr")
                .port(),
        );
        let alone = port..port + 1;
        assert_eq!(find_block(std::slice::from_ref(&alone), 0, 2), None);
    }
}
