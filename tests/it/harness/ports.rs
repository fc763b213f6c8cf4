//! Ports of 127.0.0.1 that the tests point outboxd at, or hand to a child process.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio::net::TcpSocket;

/// The lowest port [`child_port`] hands out: above the local stack's fixed ports
/// (`scripts/stack`: 15432, 18080–18083, 19092–19093).
const CHILD_PORTS_FROM: u32 = 20_000;

/// A port of 127.0.0.1 free now, for a child process to bind (a private broker,
/// chromedriver). The kernel's own choice for `127.0.0.1:0`, bound and closed, is
/// free only until the next socket asks for one: a child binding it seconds later (a
/// JVM starting) could find it taken by a test's admin server or a connection's local
/// end. These come from below the range the kernel picks such ports from
/// (`net.ipv4.ip_local_port_range`), which it never hands out by itself, each at most
/// once in this process, starting at a place of the process id's (another test
/// process picks elsewhere), and only one that binds now.
pub fn child_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below = local_port_range_low();
    assert!(
        below > CHILD_PORTS_FROM + 1_000,
        "net.ipv4.ip_local_port_range starts at {below}: the tests need ports {CHILD_PORTS_FROM}..{below} outside it"
    );
    let span = below - CHILD_PORTS_FROM;
    let start = std::process::id().wrapping_mul(97) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(CHILD_PORTS_FROM + (start + n) % span).expect("below 65536");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port of {CHILD_PORTS_FROM}..{below} binds on 127.0.0.1");
}

/// The first port of the kernel's range for ports it picks (`127.0.0.1:0`, a
/// connection's local end); Linux's default is 32768.
fn local_port_range_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port of 127.0.0.1 that refuses connections for as long as this lives: bound, never
/// listened on, and without `SO_REUSEADDR`, so no other socket is given it meanwhile. A
/// port bound and closed again is free for the next `127.0.0.1:0`: once it became the
/// admin server of the very outboxd that was to find "brokers" refusing there, and its
/// client read HTTP where it expected Kafka's answers.
pub struct ClosedPort(TcpSocket);

impl ClosedPort {
    /// Binds a port of 127.0.0.1 chosen by the kernel.
    pub fn bind() -> ClosedPort {
        let socket = TcpSocket::new_v4().expect("a TCP socket");
        socket.bind(([127, 0, 0, 1], 0).into()).expect("bind a port of 127.0.0.1");
        ClosedPort(socket)
    }

    /// Its number.
    pub fn port(&self) -> u16 {
        self.0.local_addr().expect("a bound socket's address").port()
    }
}

/// What the tests rely on: nothing else may bind the port (the kernel's own choice for
/// `127.0.0.1:0` included, which binds as this does), and a connection is refused.
#[tokio::test]
async fn a_closed_port_refuses_and_is_given_to_no_other_socket() {
    let closed = ClosedPort::bind();
    let taken = std::net::TcpListener::bind(("127.0.0.1", closed.port())).expect_err("the port is held");
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);
    let refused = tokio::net::TcpStream::connect(("127.0.0.1", closed.port())).await.expect_err("nothing listens");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // Let go, the port is anyone's again: what the tests did before.
    let port = closed.port();
    drop(closed);
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("a released port binds again");
}

/// Ports for children: distinct, bindable, and never one the kernel picks by itself.
#[test]
fn a_child_port_is_free_distinct_and_outside_the_kernels_range() {
    let below = u16::try_from(local_port_range_low()).expect("a port");
    let ports: Vec<u16> = (0..50).map(|_| child_port()).collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    for &port in &ports {
        assert!(port < below && u32::from(port) >= CHILD_PORTS_FROM, "{port} of {ports:?}");
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("a child port binds");
    }
    // What the kernel picks for `127.0.0.1:0` is in its range, never one of these.
    let picked = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    assert!(picked >= below, "{picked}");
}
