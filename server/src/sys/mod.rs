//! The operating system under the server: child process groups and their reaping, and the
//! sandbox (no new privileges, Landlock) child processes run in.

#[allow(unsafe_code)] // kill(2), waitpid(2), prctl(2): every unsafe block states its contract
pub mod process;
#[allow(unsafe_code)] // prctl(2) and the Landlock syscalls: every unsafe block states its contract
pub mod sandbox;
