//! Where the binary's log lines go: stderr, through a writer that never fails. A log
//! stream that goes away (the reading end of a pipe closed, a log collector restarting,
//! a sidecar that died) must not stop the service: a line that cannot be written is
//! dropped and counted (`outboxd_log_lines_dropped_total`), and the service goes on.
//!
//! tracing's formatter hands over each event as one buffer and, by default, reports a
//! failed write with `eprintln!`, which panics when stderr is gone: on a runtime
//! thread that was exit 101, on a librdkafka thread (a callback from C) an abort. This
//! writer answers every write as done, so there is nothing to report.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

use crate::metrics::names;

/// Makes a [`LossyStderr`] per log line (`tracing_subscriber::fmt().with_writer(..)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MakeLossyStderr;

impl<'a> MakeWriter<'a> for MakeLossyStderr {
    type Writer = LossyStderr;

    fn make_writer(&'a self) -> LossyStderr {
        LossyStderr
    }
}

/// Writes to stderr and drops what stderr does not take.
#[derive(Debug)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    /// One log line: written whole, or dropped and counted.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if !write_or_drop(&mut io::stderr().lock(), buf) {
            metrics::counter!(names::LOG_LINES_DROPPED).increment(1);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        // stderr is not buffered; a failed flush would be a dropped line, counted at the write.
        Ok(())
    }
}

/// Writes `line` to `out`; false when it could not be written whole (EPIPE, EAGAIN on a
/// full non-blocking pipe, ENOSPC, ...). Never retries: the next line may get through.
fn write_or_drop(out: &mut impl Write, line: &[u8]) -> bool {
    out.write_all(line).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose reader went away.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    #[test]
    fn a_line_the_stream_does_not_take_is_dropped_not_an_error() {
        assert!(!write_or_drop(&mut ClosedPipe, b"a line\n"));
        let mut open = Vec::new();
        assert!(write_or_drop(&mut open, b"a line\n"));
        assert_eq!(open, b"a line\n");
    }

    #[test]
    fn the_writer_answers_every_line_as_written() {
        // Whatever stderr is in the test process, the caller never sees an error.
        let mut w = MakeLossyStderr.make_writer();
        assert!(w.write_all(b"").is_ok());
        assert_eq!(w.write(b"").unwrap(), 0);
        assert!(w.flush().is_ok());
    }
}
