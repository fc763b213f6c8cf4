//! The `outboxd` binary: [`outboxd::main`] with the allocator it ships with.

use std::process::ExitCode;

/// Every event allocates in sled, rdkafka and the handler on several threads;
/// mimalloc's thread-local free lists cost less CPU than glibc's arenas there
/// (see bench/findings.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    outboxd::main()
}
