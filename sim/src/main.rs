//! `kvroute-sim`: see `kvroute_sim::cli`.

fn main() -> std::process::ExitCode {
    kvroute_sim::cli::main()
}
