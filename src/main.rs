//! `narad`: the broker and its tools in one binary.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use narad::cli::{Cli, Command, DebugCommand, InspectCommand};

mod huge_pages;

/// The broker allocates per request (bodies, replies, batch vectors) on every
/// shard at once; against glibc's malloc, which showed as 8-11% of a shard's
/// time, mimalloc cut broker CPU per message by 3-16% depending on the path,
/// for more resident memory: about 12 MiB more at idle and 50-70 MiB more per
/// shard under a full batch flow (see benches/RESULTS.md, "The allocator").
/// Huge pages go to the I/O buffers only (see [`huge_pages`]).
#[global_allocator]
static GLOBAL: huge_pages::Allocator = huge_pages::Allocator;

fn main() -> ExitCode {
    huge_pages::limit_to_advised();
    let cli = Cli::parse();
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
        Command::Serve(args) => match args.unsupported() {
            Some(refusal) => Err(refusal),
            None => narad::serve::run(serve_flags.unwrap_or_default(), args.shards),
        },
        Command::Inspect(InspectCommand::Wal { dir }) => {
            narad_tools::inspect::inspect_wal(&dir).map(|r| print!("{r}"))
        }
        Command::Inspect(InspectCommand::Log { dir }) => {
            narad_tools::inspect::inspect_log(&dir).map(|r| print!("{r}"))
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
