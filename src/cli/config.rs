//! `recast config validate|diff|apply|dump` (SPEC §2.5, `docs/config-files.md`): each returns
//! what to print and its exit code.

use std::path::{Path, PathBuf};

use super::{Exit, Outcome};
use crate::routes_file::remote::{self, Service};
use crate::routes_file::{self, Located};
use crate::rules::Limits;

/// How `diff` writes its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanOutput {
    Text,
    Json,
}

/// How `dump` writes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileOutput {
    Yaml,
    Json,
}

/// A `config` command (`recast config ...`; its doc comments are the commands' help).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConfigCommand {
    /// Check a routes file offline (no service, no network): every problem, each at its line
    /// and column; exit 1 on any.
    Validate { file: PathBuf },
    /// What applying the file would change on the service: each route created, updated (with
    /// the JSON pointers that differ), deleted (`--prune`) or unchanged.
    Diff {
        file: PathBuf,
        /// The file's owner: given to its routes that name none; `--prune` deletes only its routes.
        #[arg(long)]
        owner: Option<String>,
        /// Also delete the owner's routes that the file does not hold (needs --owner).
        #[arg(long)]
        prune: bool,
        /// `text` (the default) or `json`.
        #[arg(long, value_enum, default_value = "text")]
        output: PlanOutput,
        /// Exit 2 when the file and the service differ (a drift check).
        #[arg(long)]
        exit_code: bool,
    },
    /// Carry the diff out: creates and updates (each with its live call, each update only if the
    /// route is still the version the diff saw), then deletions; stops at the first failure.
    Apply {
        file: PathBuf,
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        prune: bool,
    },
    /// The service's routes (of --owner) as a routes file, secrets as `***`.
    Dump {
        #[arg(long)]
        owner: Option<String>,
        /// `yaml` (the default) or `json`.
        #[arg(long, value_enum, default_value = "yaml")]
        output: FileOutput,
    },
}

/// Runs `command` (`url` and `token` reach the service for all but `validate`).
pub async fn run(url: &str, token: Option<&str>, command: &ConfigCommand, limits: &Limits) -> Outcome {
    match command {
        ConfigCommand::Validate { file } => validate(file, limits),
        ConfigCommand::Diff { file, owner, prune, output, exit_code } => {
            let service = Service::new(url, token);
            let (steps, notes) = match planned(&service, file, owner.as_deref(), *prune, limits).await {
                Ok(planned) => planned,
                Err(outcome) => return outcome,
            };
            let text = match output {
                PlanOutput::Json => format!("{}\n", remote::plan_json(&steps)),
                PlanOutput::Text => remote::plan_text(&steps, false),
            };
            let exit = if *exit_code && remote::differs(&steps) { Exit::Differs } else { Exit::Ok };
            Outcome { exit, stdout: text.into_bytes(), stderr: notes }
        }
        ConfigCommand::Apply { file, owner, prune } => {
            let service = Service::new(url, token);
            let (steps, notes) = match planned(&service, file, owner.as_deref(), *prune, limits).await {
                Ok(planned) => planned,
                Err(outcome) => return outcome,
            };
            let mut out = String::new();
            let applied = remote::apply(&service, &steps, &mut |line| {
                out.push_str(&line);
                out.push('\n');
            })
            .await;
            match applied {
                Ok(()) => {
                    let [create, update, delete, unchanged] = remote::counts(&steps);
                    out.push_str(&format!(
                        "applied: {create} created, {update} updated, {delete} deleted, {unchanged} unchanged\n"
                    ));
                    Outcome::ok(out.into_bytes(), notes)
                }
                Err(why) => Outcome {
                    exit: Exit::Problems,
                    stdout: out.into_bytes(),
                    stderr: format!(
                        "{notes}error: {why}\nstopped: the lines above were applied; nothing after them\n"
                    ),
                },
            }
        }
        ConfigCommand::Dump { owner, output } => {
            let service = Service::new(url, token);
            match remote::dump(&service, owner.as_deref()).await {
                Ok((file, notes)) => {
                    let text = match output {
                        FileOutput::Json => format!("{}\n", file.to_json()),
                        FileOutput::Yaml => remote::to_yaml(&file),
                    };
                    let notes: String = notes.iter().map(|n| format!("note: {n}\n")).collect();
                    Outcome::ok(text.into_bytes(), notes)
                }
                Err(why) => Outcome::failed(Exit::Unavailable, format!("error: {why}\n")),
            }
        }
    }
}

/// `validate`: the file's problems, or how many routes and consumers it holds.
fn validate(file: &Path, limits: &Limits) -> Outcome {
    match routes_file::read(file, limits, None) {
        Ok(read) => Outcome::ok(
            Vec::new(),
            format!(
                "{}: valid ({} routes, {} consumers)\n",
                file.display(),
                read.routes.len(),
                read.consumers.len()
            ),
        ),
        Err(problems) => Outcome::failed(Exit::Problems, told(file, &problems)),
    }
}

/// Every problem of `file` on a line of its own, then their count.
fn told(file: &Path, problems: &[Located]) -> String {
    let mut out: String = problems.iter().map(|p| format!("{}:{p}\n", file.display())).collect();
    out.push_str(&format!("{}: {} problem(s)\n", file.display(), problems.len()));
    out
}

/// The file read and checked, its plan against the service, and notes for standard error.
async fn planned(
    service: &Service,
    file: &Path,
    owner: Option<&str>,
    prune: bool,
    limits: &Limits,
) -> Result<(Vec<remote::Step>, String), Outcome> {
    if prune && owner.is_none() {
        return Err(Outcome::failed(
            Exit::Usage,
            "--prune deletes routes of one owner only: give --owner\n".to_owned(),
        ));
    }
    if let Some(owner) = owner
        && !crate::route::is_label(owner)
    {
        return Err(Outcome::failed(
            Exit::Usage,
            "--owner must be 1 to 63 characters of a-z, 0-9 and '-', starting with a letter or a digit\n"
                .to_owned(),
        ));
    }
    let read = routes_file::read(file, limits, owner)
        .map_err(|problems| Outcome::failed(Exit::Problems, told(file, &problems)))?;
    let mut notes = String::new();
    if !read.consumers.is_empty() {
        notes.push_str("note: the file's consumers are served by nodes from the file (RECAST_ROUTES_FILE); `recast consumers` manages a service's\n");
    }
    match remote::plan(service, &read, owner, prune).await {
        Ok(steps) => Ok((steps, notes)),
        Err(problems) => {
            let unreachable = problems.len() == 1 && problems[0].starts_with("cannot reach");
            let text: String = problems.iter().map(|p| format!("error: {p}\n")).collect();
            Err(Outcome::failed(if unreachable { Exit::Unavailable } else { Exit::Problems }, notes + &text))
        }
    }
}
