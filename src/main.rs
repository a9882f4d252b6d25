//! `narad`: the broker and its tools in one binary.

use std::process::ExitCode;

use clap::Parser;
use narad::cli::{Cli, Command, DebugCommand, InspectCommand};

fn main() -> ExitCode {
    let cli = Cli::parse();
    narad::cli::init_logging(&cli);
    let result = match cli.command {
        Command::Serve(args) => narad::serve::run(args),
        Command::Inspect(InspectCommand::Wal { dir }) => {
            narad_tools::inspect::inspect_wal(&dir).map(|r| print!("{r}"))
        }
        Command::Inspect(InspectCommand::Log { dir }) => {
            narad_tools::inspect::inspect_log(&dir).map(|r| print!("{r}"))
        }
        Command::Debug(DebugCommand::WalWriter(args)) => narad::devtools::wal_writer(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("narad: {message}");
            ExitCode::FAILURE
        }
    }
}
