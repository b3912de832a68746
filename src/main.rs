//! The `tally` binary: parses the command line and runs one subcommand.

fn main() {
    println!("tally");
}
