//! `axle get burst`: cloud burst instances (state, provider, region, price,
//! cost so far), then each team's spend against its budget this month.

use std::process::ExitCode;

use axle_policy::Usd;

use crate::args::ListFormat;
use crate::client::Client;
use crate::get_cmd::GetArgs;
use crate::table::{self, Row};
use crate::workload_cmd::now_ms;

const INSTANCE_HEADERS: &[&str] = &[
    "BURST", "TEAM", "WORKLOAD", "STATE", "PROVIDER", "REGION", "TYPE", "GPUS", "PRICE/H", "COST",
    "AGE",
];
const SPEND_HEADERS: &[&str] = &["TEAM", "BUDGET", "COMMITTED", "SPENT", "BY PROVIDER"];

fn usd(micros: u64) -> String {
    Usd::from_micros(micros).to_string()
}

pub async fn run(client: &Client, a: &GetArgs) -> anyhow::Result<ExitCode> {
    let v = client.burst().await?;
    if let Some(format) = crate::get_cmd::structured(a.output) {
        print!("{}", crate::args::to_text(&v, format)?);
        return Ok(ExitCode::SUCCESS);
    }
    let instances: Vec<_> = v
        .instances
        .iter()
        .filter(|i| a.team.as_ref().is_none_or(|t| &i.team == t))
        .collect();
    if a.output == ListFormat::Name {
        for i in &instances {
            println!("burst/{}", i.id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !v.enabled && !a.no_headers {
        println!(
            "this hub does not burst (start it with --burst); budgets as the policy sets them:"
        );
    }
    let now = now_ms();
    let rows: Vec<Row> = instances
        .iter()
        .map(|i| Row {
            key: i.id.clone(),
            cells: vec![
                i.id.clone(),
                table::printable(&i.team).into_owned(),
                i.workload.to_string(),
                i.state.clone(),
                table::printable(&i.provider).into_owned(),
                table::printable(&i.region).into_owned(),
                table::printable(&i.instance_type).into_owned(),
                format!(
                    "{}x{}{}",
                    i.gpus,
                    i.gpu_model,
                    if i.spot { " spot" } else { "" }
                ),
                usd(i.price_per_hour_micro_usd),
                usd(i.cost_micro_usd),
                table::age(now, i.created_at_ms),
            ],
        })
        .collect();
    if !rows.is_empty() {
        let header = (!a.no_headers).then_some(INSTANCE_HEADERS);
        print!("{}", crate::layout::render(header, &rows, None));
        if !a.no_headers {
            println!();
        }
    } else if !a.no_headers {
        println!("no burst instances in {}", v.month);
    }
    let spend: Vec<Row> = v
        .teams
        .iter()
        .filter(|t| a.team.as_ref().is_none_or(|n| &t.team == n))
        .map(|t| Row {
            key: t.team.clone(),
            cells: vec![
                table::printable(&t.team).into_owned(),
                usd(t.budget_micro_usd),
                usd(t.committed_micro_usd),
                usd(t.spent_micro_usd),
                t.by_provider
                    .iter()
                    .map(|(p, m)| format!("{p} {}", usd(*m)))
                    .collect::<Vec<_>>()
                    .join(", "),
            ],
        })
        .collect();
    if !a.no_headers {
        println!("spend in {} (UTC):", v.month);
    }
    print!(
        "{}",
        crate::layout::render(Some(SPEND_HEADERS), &spend, None)
    );
    Ok(ExitCode::SUCCESS)
}
