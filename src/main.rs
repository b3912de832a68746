//! The `tally` binary: parses the command line and runs one subcommand (see `tally::cli`).

// No `unwrap` or `expect` outside tests (checked by clippy in CI): input from users, files and the
// network gets a clear error instead; an invariant the code relies on says why where it holds.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

fn main() -> std::process::ExitCode {
    few_malloc_arenas();
    tally::cli::main()
}

/// glibc gives each thread that allocates its own malloc arena, up to 8 per core, each
/// reserving 64 MiB of address space: on a 2-core machine up to 1 GiB reserved for a daemon
/// that uses a few tens of MiB. Two arenas keep the daemon's address space near what it uses
/// (the image budget's ceiling in ARCHITECTURE.md "Memory" counts on it), at no measurable
/// cost for tally's few threads. Before any thread exists, as glibc asks.
fn few_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator; called before any other thread
    // exists, so no allocation races it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
