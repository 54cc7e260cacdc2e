//! quiver-server binary: the global allocator, then the command line in `cli`.
//!
//! With the `jemalloc` feature (the default) the binary carries both jemalloc and the
//! system allocator, and `QUIVER_ALLOCATOR=system` in its environment selects the latter
//! (the operator sets it for `tuning.allocator: system`). One image, one build.

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: quiver_server::alloc::Selectable = quiver_server::alloc::Selectable;

fn allocator() -> &'static str {
    #[cfg(feature = "jemalloc")]
    return quiver_server::alloc::name();
    #[cfg(not(feature = "jemalloc"))]
    return "system";
}

fn main() -> std::process::ExitCode {
    match quiver_server::cli::main(allocator()) {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
