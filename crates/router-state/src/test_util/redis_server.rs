//! A Redis server of the test's own: `redis-server` started on a free loopback port,
//! without persistence, and stopped by its pid when the handle drops.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

/// A running `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Starts a server on a free port and returns once it accepts connections.
    ///
    /// # Panics
    /// `redis-server` is not installed (`cargo xtask ci` installs it) or does not
    /// start.
    pub fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            match spawn(port) {
                Ok(child) => {
                    return Self {
                        child: Some(child),
                        port,
                    };
                }
                Err(output) => last = output,
            }
        }
        panic!("redis-server did not start:\n{last}");
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing was persisted).
    ///
    /// # Panics
    /// It does not start.
    pub fn restart(&mut self) {
        self.stop();
        match spawn(self.port) {
            Ok(child) => self.child = Some(child),
            Err(output) => panic!("redis-server did not restart:\n{output}"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Starts `redis-server` on `port`, waiting for its "Ready to accept connections"
/// line; `Err` with what it printed when it exits first.
#[allow(
    clippy::zombie_processes,
    reason = "the child is returned to a handle that waits for it when stopped or dropped"
)]
fn spawn(port: u16) -> Result<Child, String> {
    let port_arg = port.to_string();
    let mut child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port_arg,
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting redis-server: {e}; install it (`apt-get install redis-server`, which `cargo xtask ci` does)"
            )
        });
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut printed = String::new();
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            let _ = child.wait();
            return Err(printed);
        }
        if line.contains("Ready to accept connections") {
            // Keep draining its log so the pipe never fills.
            std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
            return Ok(child);
        }
        if printed.len() < 64 * 1024 {
            printed.push_str(&line);
        }
    }
}
