//! Ports of 127.0.0.1 that the tests point outboxd at.

use tokio::net::TcpSocket;

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
