//! `narad`: the broker and its tools in one binary.

use std::io::Write;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use narad::cli::{Cli, Command, DebugCommand, InspectCommand};

/// The broker allocates per request (bodies, replies, batch vectors) on every
/// shard at once; against glibc's malloc, which showed as 8-11% of a shard's
/// time, mimalloc cut broker CPU per message by 3-16% depending on the path,
/// for more resident memory: about 12 MiB more at idle and 50-70 MiB more per
/// shard under a full batch flow (see benches/RESULTS.md, "The allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`).
/// With them, the allocator's first touch of fresh memory faulted in a whole
/// 2 MiB page and zeroed it on the spot: a shard stalled for 5-9 ms a few times
/// a second while its memory grew, which made most of the produce p99 at half
/// the closed-loop rate (benches/RESULTS.md, "Huge pages and the produce tail").
/// The price is batch produce, 3-10% slower without them; advising them
/// on the I/O buffers alone did not win that back. The kernel checks the flag
/// at each fault, so memory mapped before this call is covered too. Where the
/// call is unknown, nothing changes.
fn disable_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

fn main() -> ExitCode {
    disable_huge_pages();
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let server_given = matches.value_source("server") == Some(ValueSource::CommandLine);
    // `serve` sets up logging itself, once its configuration (which may name the log
    // level and format) is loaded.
    let serve_flags = match &cli.command {
        Command::Serve(args) => Some(cli.serve_flags(args)),
        _ => {
            narad::cli::init_logging(&cli.tool_logging());
            None
        }
    };
    let result = match cli.command {
        Command::Serve(args) => match args
            .unsupported()
            .or_else(|| server_given.then(|| narad::cli::SERVER_FLAG_ON_SERVE.to_string()))
        {
            Some(refusal) => Err(refusal),
            None => narad::serve::run(serve_flags.unwrap_or_default(), args.shards),
        },
        Command::Inspect(what) => {
            let report = match what {
                InspectCommand::Wal { dir } => narad_tools::inspect::inspect_wal(&dir),
                InspectCommand::Log { dir } => narad_tools::inspect::inspect_log(&dir),
            };
            match report {
                // Damage found is told apart from a failure to look (1).
                Ok(report) if report.damaged => {
                    print!("{}", report.text);
                    let _ = writeln!(std::io::stderr(), "narad: damage found (see CORRUPT above)");
                    return ExitCode::from(2);
                }
                Ok(report) => {
                    print!("{}", report.text);
                    Ok(())
                }
                Err(message) => Err(message),
            }
        }
        Command::Debug(DebugCommand::WalWriter(args)) => narad::devtools::wal_writer(args),
        Command::Version => {
            println!("narad {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Completion { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "narad", &mut std::io::stdout());
            Ok(())
        }
        Command::Bench(args) => {
            return match narad_tools::bench::run(&args.config(&cli.server)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    let _ = writeln!(std::io::stderr(), "narad: {}", error.message());
                    ExitCode::from(error.exit_code())
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // Not `eprintln!`, which panics when standard error is closed.
            let _ = writeln!(std::io::stderr(), "narad: {message}");
            ExitCode::FAILURE
        }
    }
}
