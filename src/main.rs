//! The `tally` binary: parses the command line and runs one subcommand (see `tally::cli`).

fn main() -> std::process::ExitCode {
    tally::cli::main()
}
