//! The `delayq` command: parse arguments, hand over to the subcommand.

fn main() -> std::process::ExitCode {
    delayq::cli::main()
}
