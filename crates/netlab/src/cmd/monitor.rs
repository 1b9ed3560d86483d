//! `netlab monitor`: give a node a monitor port (the library's `monitor` plan operations).

use super::*;

#[derive(Args)]
pub struct MonitorArgs {
    #[arg(long)]
    pub run: Option<String>,
    pub host: String,
    /// The monitor port's name (its sending end is NAME-tx).
    #[arg(long, default_value = "mon0")]
    pub name: String,
    /// Remove the port and the mirroring instead.
    #[arg(long)]
    pub remove: bool,
}

pub fn run(a: MonitorArgs) -> Result<ExitCode, LabError> {
    let MonitorArgs {
        run,
        host,
        name,
        remove,
    } = a;
    lab::require_caps()?;
    sweep_quietly();
    netlab::monitor::check_name(&name)?;
    let st = lab::find_run(&state_dir(), run.as_deref())?;
    if remove {
        netlab::monitor::remove(&st, &host, &name)?;
    } else {
        netlab::monitor::add(&st, &host, &name)?;
    }
    if remove {
        println!("removed monitor port {name} from {host}");
    } else {
        println!(
            "{host}: monitor port {name} mirrors every frame of its lab interfaces; capture there with \
             `netlab exec {host} -- capture -i {name} --mode xdp ...`"
        );
    }
    Ok(ExitCode::SUCCESS)
}
