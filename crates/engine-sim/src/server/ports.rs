//! Free local ports for tests of engines with several ranks.

/// The first port of each of `N` ranges of consecutive free ports, `sizes[i]` ports
/// long: one block of them all, found free at once (every port bound together) and cut
/// in order, so no two ranges overlap. For tests of engines with several ranks,
/// whose ZeroMQ sockets bind consecutive ports from a fixed base.
///
/// # Panics
/// When no such block is found in 50 tries.
pub fn free_port_ranges<const N: usize>(sizes: [u16; N]) -> [u16; N] {
    let total: u16 = sizes.iter().sum();
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("binds")
            .local_addr()
            .expect("addr")
            .port();
        if first.checked_add(total).is_none() {
            continue;
        }
        let held: Result<Vec<_>, _> = (0..total)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)))
            .collect();
        if held.is_ok() {
            let mut next = first;
            return sizes.map(|size| {
                let start = next;
                next += size;
                start
            });
        }
    }
    panic!("no {total} consecutive free ports");
}
