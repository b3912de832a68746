//! `tally service install | uninstall | status`: run `tally serve` with the computer, as a
//! per-user service that needs no root — a systemd user unit on Linux, a launchd agent on
//! macOS, a logon task on Windows — with this configuration and data directory, restarted after
//! a crash, its log in `tally.log` in the data directory. Where no per-user service manager
//! answers (no systemd user instance, a container), install says so and exits non-zero,
//! writing nothing.
//!
//! The Linux unit is what the tests check with `systemd-analyze verify`; the macOS and Windows
//! paths follow their documented commands (`launchctl bootstrap gui/UID`, `schtasks /Create
//! /SC ONLOGON`) and are not run in this project's CI (no such machine).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use super::{Exit, Failure};
use crate::config::Config;

/// The service's name (systemd unit `tally.service`, launchd label `dev.tally.serve`).
pub const NAME: &str = "tally";
const LAUNCHD_LABEL: &str = "dev.tally.serve";

/// `tally service …`.
#[derive(Debug, clap::Subcommand)]
pub enum ServiceCommand {
    /// Install and start a per-user service that runs `tally serve` with this configuration
    /// and data directory whenever you are logged in (no root needed).
    Install {
        /// Print the service definition instead of installing it.
        #[arg(long)]
        print: bool,
    },
    /// Stop and remove the service.
    Uninstall,
    /// Whether the service is installed and running, its address and its log.
    Status,
}

/// The command line the service runs: this binary, `serve --no-browser`, and the config
/// file and data directory as absolute paths.
fn serve_args(cfg: &Config, config_path: Option<&Path>) -> Result<Vec<String>, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::error(format!("cannot find tally's own binary: {e}")))?;
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string();
    let mut args = vec![abs(&exe), "serve".into(), "--no-browser".into()];
    if let Some(c) = config_path {
        args.extend(["--config".into(), abs(c)]);
    }
    args.extend(["--data-dir".into(), abs(&cfg.storage.data_dir)]);
    Ok(args)
}

/// The log file the service writes.
fn log_path(cfg: &Config) -> PathBuf {
    std::path::absolute(cfg.storage.data_dir.join("tally.log"))
        .unwrap_or_else(|_| cfg.storage.data_dir.join("tally.log"))
}

/// A systemd user unit for `args`, logging to `log`.
pub fn systemd_unit(args: &[String], log: &Path) -> String {
    let quoted: Vec<String> = args.iter().map(|a| systemd_quote(a)).collect();
    format!(
        "[Unit]\nDescription=tally: paid image jobs that never pay twice without you knowing\n\
         After=network-online.target\n\n\
         [Service]\nType=simple\nExecStart={}\nEnvironment=TALLY_SERVICE=1\nRestart=on-failure\nRestartSec=2\n\
         StandardOutput=append:{log}\nStandardError=append:{log}\n\n\
         [Install]\nWantedBy=default.target\n",
        quoted.join(" "),
        log = log.display()
    )
}

/// Quote one word of a systemd command line (double quotes, with `\` and `"` escaped; `%`
/// doubled, systemd's specifier escape).
fn systemd_quote(word: &str) -> String {
    let escaped = word.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%");
    if escaped.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=".contains(c)) {
        escaped
    } else {
        format!("\"{escaped}\"")
    }
}

/// A launchd agent (macOS) for `args`, logging to `log`.
pub fn launchd_plist(args: &[String], log: &Path) -> String {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let items: String = args.iter().map(|a| format!("    <string>{}</string>\n", esc(a))).collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \
         \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n<plist version=\"1.0\">\n<dict>\n  <key>Label</key>\n  \
         <string>{LAUNCHD_LABEL}</string>\n  <key>ProgramArguments</key>\n  <array>\n{items}  </array>\n  \
         <key>EnvironmentVariables</key>\n  <dict><key>TALLY_SERVICE</key><string>1</string></dict>\n  \
         <key>RunAtLoad</key>\n  <true/>\n  <key>KeepAlive</key>\n  <dict><key>SuccessfulExit</key><false/></dict>\n  \
         <key>StandardOutPath</key>\n  <string>{log}</string>\n  <key>StandardErrorPath</key>\n  <string>{log}</string>\n\
         </dict>\n</plist>\n",
        log = esc(&log.display().to_string())
    )
}

/// Where the systemd user unit goes.
fn unit_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| directories::BaseDirs::new().map(|d| d.home_dir().join(".config")))?;
    Some(base.join("systemd/user").join(format!("{NAME}.service")))
}

/// Run a service manager's command; its output when it succeeded, else why not.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    match Command::new(program).args(args).output() {
        Err(e) => Err(format!("`{program}` could not be run: {e}")),
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let out_text = String::from_utf8_lossy(&out.stdout);
            Err(format!("`{program} {}` failed: {}", args.join(" "), format!("{err}{out_text}").trim()))
        }
    }
}

/// Run `tally service …`.
pub fn service(cfg: &Config, config_path: Option<&Path>, cmd: ServiceCommand) -> Result<ExitCode, Failure> {
    let args = serve_args(cfg, config_path)?;
    let log = log_path(cfg);
    if cfg!(target_os = "macos") {
        return launchd(cmd, &args, &log);
    }
    if cfg!(windows) {
        return windows(cmd, &args);
    }
    systemd(cmd, &args, &log, cfg)
}

fn no_manager(why: String) -> Failure {
    Failure::error(format!(
        "no per-user service manager answers here ({why}); tally cannot run with the computer on this machine. \
         Start it with `tally serve` instead (or use your system's own way to run a program at login)"
    ))
}

fn systemd(cmd: ServiceCommand, args: &[String], log: &Path, cfg: &Config) -> Result<ExitCode, Failure> {
    let unit = systemd_unit(args, log);
    let path = unit_path().ok_or_else(|| Failure::error("cannot find your home directory for the service unit"))?;
    let unit_name = format!("{NAME}.service");
    match cmd {
        ServiceCommand::Install { print: true } => {
            print!("{unit}");
            Ok(Exit::Ok.into())
        }
        ServiceCommand::Install { print: false } => {
            // The user's own systemd instance must answer before anything is written.
            run("systemctl", &["--user", "show-environment"]).map_err(no_manager)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Failure::error(format!("cannot create {}: {e}", dir.display())))?;
            }
            std::fs::write(&path, &unit)
                .map_err(|e| Failure::error(format!("cannot write {}: {e}", path.display())))?;
            run("systemctl", &["--user", "daemon-reload"]).map_err(Failure::error)?;
            run("systemctl", &["--user", "enable", "--now", &unit_name]).map_err(Failure::error)?;
            println!("installed {} and started it; it starts whenever you log in", path.display());
            println!("log: {}", log.display());
            println!("(to keep it running after you log out: `loginctl enable-linger`)");
            Ok(Exit::Ok.into())
        }
        ServiceCommand::Uninstall => {
            let manager = run("systemctl", &["--user", "disable", "--now", &unit_name]);
            let existed = path.exists();
            if existed {
                std::fs::remove_file(&path)
                    .map_err(|e| Failure::error(format!("cannot remove {}: {e}", path.display())))?;
            }
            let _ = run("systemctl", &["--user", "daemon-reload"]);
            match (existed, manager) {
                (false, _) => println!("no tally service was installed ({} does not exist)", path.display()),
                (true, Ok(_)) => println!("stopped and removed {}", path.display()),
                (true, Err(why)) => println!("removed {} (the service manager said: {why})", path.display()),
            }
            Ok(Exit::Ok.into())
        }
        ServiceCommand::Status => {
            let installed = path.exists();
            let active = run("systemctl", &["--user", "is-active", &unit_name]);
            println!("service   {}", if installed { path.display().to_string() } else { "not installed".into() });
            println!(
                "running   {}",
                match &active {
                    Ok(s) => s.clone(),
                    Err(_) if !installed => "no".into(),
                    Err(why) => format!("no ({why})"),
                }
            );
            println!(
                "address   http://{}",
                crate::app::served_address(&cfg.storage.data_dir).unwrap_or(cfg.server.listen)
            );
            println!("log       {}", log.display());
            Ok(if installed && active.is_ok() { Exit::Ok } else { Exit::Error }.into())
        }
    }
}

fn launchd(cmd: ServiceCommand, args: &[String], log: &Path) -> Result<ExitCode, Failure> {
    let plist = launchd_plist(args, log);
    let home =
        directories::BaseDirs::new().map(|d| d.home_dir().to_path_buf()).ok_or_else(|| Failure::error("no home"))?;
    let path = home.join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist"));
    let uid = run("id", &["-u"]).map_err(no_manager)?;
    let domain = format!("gui/{uid}");
    match cmd {
        ServiceCommand::Install { print: true } => {
            print!("{plist}");
        }
        ServiceCommand::Install { print: false } => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| Failure::error(format!("{}: {e}", dir.display())))?;
            }
            std::fs::write(&path, plist).map_err(|e| Failure::error(format!("{}: {e}", path.display())))?;
            run("launchctl", &["bootstrap", &domain, &path.display().to_string()]).map_err(no_manager)?;
            println!("installed {} and started it; log: {}", path.display(), log.display());
        }
        ServiceCommand::Uninstall => {
            let _ = run("launchctl", &["bootout", &format!("{domain}/{LAUNCHD_LABEL}")]);
            let _ = std::fs::remove_file(&path);
            println!("stopped and removed {}", path.display());
        }
        ServiceCommand::Status => {
            let up = run("launchctl", &["print", &format!("{domain}/{LAUNCHD_LABEL}")]).is_ok();
            println!(
                "service   {}\nrunning   {}\nlog       {}",
                path.display(),
                if up { "yes" } else { "no" },
                log.display()
            );
            return Ok(if up { Exit::Ok } else { Exit::Error }.into());
        }
    }
    Ok(Exit::Ok.into())
}

fn windows(cmd: ServiceCommand, args: &[String]) -> Result<ExitCode, Failure> {
    let line: Vec<String> = args.iter().map(|a| format!("\"{a}\"")).collect();
    let line = line.join(" ");
    match cmd {
        ServiceCommand::Install { print: true } => println!("schtasks /Create /SC ONLOGON /TN {NAME} /TR {line}"),
        ServiceCommand::Install { print: false } => {
            run("schtasks", &["/Create", "/F", "/SC", "ONLOGON", "/TN", NAME, "/TR", &line]).map_err(no_manager)?;
            let _ = run("schtasks", &["/Run", "/TN", NAME]);
            println!("installed the logon task `{NAME}` and started it");
        }
        ServiceCommand::Uninstall => {
            let _ = run("schtasks", &["/End", "/TN", NAME]);
            run("schtasks", &["/Delete", "/F", "/TN", NAME]).map_err(Failure::error)?;
            println!("removed the logon task `{NAME}`");
        }
        ServiceCommand::Status => {
            let out = run("schtasks", &["/Query", "/TN", NAME]);
            println!("{}", out.as_deref().unwrap_or("not installed"));
            return Ok(if out.is_ok() { Exit::Ok } else { Exit::Error }.into());
        }
    }
    Ok(Exit::Ok.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_quotes_paths_and_restarts_after_a_crash() {
        let args = vec!["/opt/my tally/tally".to_string(), "serve".into(), "--data-dir".into(), "/home/a/100%".into()];
        let unit = systemd_unit(&args, Path::new("/home/a/tally.log"));
        assert!(unit.contains("ExecStart=\"/opt/my tally/tally\" serve --data-dir \"/home/a/100%%\""), "{unit}");
        assert!(unit.contains("Restart=on-failure") && unit.contains("WantedBy=default.target"));
        assert!(unit.contains("StandardOutput=append:/home/a/tally.log"));
        let plist = launchd_plist(&args, Path::new("/Users/a/tally.log"));
        assert!(plist.contains("<string>/opt/my tally/tally</string>") && plist.contains("<key>KeepAlive</key>"));
    }
}
