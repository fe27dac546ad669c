//! The `delayq` command: the service shell (`run`), the operator's subcommands and
//! the tools (bench, drill, demo), over the daemon library.

mod cli;

/// The daemon allocates and frees small buffers per request and per message on
/// every thread: mimalloc's thread-local heaps take less CPU for that than glibc's
/// allocator (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
