//! Runs `tally bench` standalone until the CLI wires it: `cargo run --release --example bench -- --quick`.

use clap::Parser;

/// Command line of the standalone benchmark runner.
#[derive(Parser)]
#[command(about = "Measure tally's engine end to end (see BENCHMARKS.md)")]
struct Cli {
    #[command(flatten)]
    args: tally::bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = tally::bench::run(cli.args) {
        eprintln!("bench failed: {e}");
        std::process::exit(1);
    }
}
