//! kube-proxy-rs: a drop-in replacement for Kubernetes' kube-proxy.
//!
//! This binary only wires the pipeline together (see ARCHITECTURE.md): flags and config file
//! (kpr-config) -> sources (kpr-sources) -> the node's facts (node) -> sync loop (kpr-sync)
//! -> one backend per IP family of the chosen mode (`mode`: kpr-mode's seam) -> kernel, with
//! health and metrics served by kpr-servers. Everything that decides what the rules are
//! lives in the library crates.

mod allocator;
mod events;
mod explain;
mod families;
mod health_check_servers;
mod logging;
mod mode;
mod node;
mod proxy;

use std::process::ExitCode;

use kpr_config::{ConfigError, Settings};

use kpr_mode::Fatal;

fn main() -> ExitCode {
    allocator::tune();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if explain::requested(&args) {
        return explain::run(&args);
    }
    let settings = match kpr_config::load(args) {
        Ok(settings) => settings,
        Err(error) => return config_error(&error),
    };
    logging::init(settings.verbosity, settings.log_format);
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    match run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            tracing::error!("{}", fatal.message);
            ExitCode::from(fatal.code)
        }
    }
}

/// Prints a flag or config-file error the way operators expect: clap's own rendering for
/// flags (and `--help`), one line naming the file, flag or field otherwise.
fn config_error(error: &ConfigError) -> ExitCode {
    match error {
        ConfigError::Cli(clap_error) => {
            // Best effort: if stdout/stderr are gone there is no one to tell.
            let _ = clap_error.print();
        }
        other => eprintln!("kube-proxy-rs: {other}"),
    }
    ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(1))
}

/// Upstream's order: `--write-config-to` and `--cleanup` exit before anything else starts.
fn run(settings: Settings) -> Result<(), Fatal> {
    if let Some(path) = &settings.write_config_to {
        kpr_config::write_config_file(&settings.config, path).map_err(Fatal::from_config)?;
        tracing::info!(path = %path.display(), "wrote the effective configuration");
        return Ok(());
    }
    if settings.cleanup {
        return mode::cleanup(&settings);
    }
    let chosen = mode::implementation(settings.mode);
    mode::refuse_gated(chosen, &settings)?;
    mode::warn_at_start_up(chosen, &settings);
    if !settings.dry_run {
        // Before anything is changed; `--dry-run` changes nothing and needs nothing.
        chosen.check_host(&settings)?;
        mode::remove_other_modes_leftovers(chosen, &settings);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Fatal::runtime(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(proxy::run(settings))
}
