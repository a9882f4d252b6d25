//! `narad bench` against a real node: its exit code and its stderr lines, that
//! the records it reports as accepted are committed on the broker, that a
//! flow run consumes every record it produced, and that `--report` writes a
//! page with its charts.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Node, WAIT_MAX};

fn bench(node: &Node, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_narad"))
        .arg("bench")
        .args(args)
        .args(["-s", &format!("http://{}", node.addr)])
        .env_remove("NARAD_ADDR")
        .output()
        .unwrap()
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The sum of the partitions' next offsets: the records committed.
fn committed_records(node: &Node, topic: &str) -> u64 {
    let response = node
        .served_client()
        .request("GET", &format!("/v1/topics/{topic}"), &[], "")
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let topic: serde_json::Value = serde_json::from_str(&response.body).unwrap();
    topic["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum()
}

fn await_committed(node: &Node, topic: &str, expected: u64) {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let committed = committed_records(node, topic);
        if committed == expected {
            return;
        }
        assert!(
            committed < expected,
            "{committed} committed, {expected} sent"
        );
        assert!(
            Instant::now() < deadline,
            "only {committed} of {expected} committed in time"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks the three lines of a clean run (the reference's two, then the
/// figures) and returns the result line.
fn check_clean_run(output: &Output, start_line: &str, ok_records: u64) -> String {
    let lines = stderr_lines(output);
    assert!(output.status.success(), "{:?}: {lines:#?}", output.status);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let figures = &lines[2];
    assert!(figures.starts_with("produce figures: "), "{figures}");
    for part in [
        " msg/s, ",
        " MB/s; latency p50=",
        " p90=",
        " p99.9=",
        " max=",
        "; errors: none",
    ] {
        assert!(figures.contains(part), "{part}: {figures}");
    }
    assert_eq!(lines[0], start_line);
    let result = &lines[1];
    let prefix = format!("produce: {ok_records} ok, 0 failed in ");
    assert!(result.starts_with(&prefix), "{result}");
    assert!(result.contains(" msg/s; latency p50="), "{result}");
    assert!(
        result.contains(" p95=") && result.contains(" p99="),
        "{result}"
    );
    result.clone()
}

#[test]
fn single_and_batch_produce_runs_commit_every_record_they_report() {
    let node = Node::start(&[]);

    let output = bench(
        &node,
        &[
            "t",
            "--create",
            "--count",
            "2000",
            "--workers",
            "4",
            "--size",
            "128",
        ],
    );
    check_clean_run(&output, "producing 2000 × 128B with 4 workers...", 2000);
    assert!(output.stdout.is_empty());
    await_committed(&node, "t", 2000);

    // 1000 records in batches of 50 are 20 requests, so only 20 of the 32
    // workers have one to send.
    let output = bench(
        &node,
        &[
            "tb",
            "--create",
            "--partitions",
            "4",
            "--batch",
            "50",
            "--count",
            "1000",
            "--workers",
            "32",
            "--json",
        ],
    );
    check_clean_run(
        &output,
        "producing 1000 × 256B in batches of 50 with 20 workers...",
        1000,
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["ok"], 1000);
    assert_eq!(summary["failed"], 0);
    assert!(summary["p50_us"].as_u64().unwrap() <= summary["max_us"].as_u64().unwrap());
    await_committed(&node, "tb", 1000);
}

#[test]
fn a_missing_topic_and_bad_consume_flags_are_refused() {
    let node = Node::start(&[]);

    let output = bench(&node, &["absent", "--count", "10"]);
    assert_eq!(output.status.code(), Some(1));
    let lines = stderr_lines(&output);
    assert!(
        lines.last().unwrap().contains("does not exist"),
        "{lines:#?}"
    );

    // A counted consume of a topic with fewer messages says so, and fails.
    let output = bench(
        &node,
        &["dry", "--create", "--mode", "consume", "--count", "10"],
    );
    assert_eq!(output.status.code(), Some(1));
    let lines = stderr_lines(&output);
    assert!(
        lines
            .last()
            .unwrap()
            .contains("0 of 10 messages consumed: the topic had no more"),
        "{lines:#?}"
    );

    for (args, expected) in [
        (
            &["t", "--consume", "--max", "101"][..],
            "--max must be 1 to 100",
        ),
        (
            &["t", "--consume", "--mode", "produce"][..],
            "--consume means --mode flow",
        ),
        (&["t", "--max", "5"][..], "--max applies to"),
        (
            &["t", "--cpus", "3-1"][..],
            "--cpus \"3-1\": the range 3-1 runs backwards",
        ),
        // --cpu is an alias of --cpus.
        (
            &["t", "--cpu", "x"][..],
            "--cpus \"x\": \"x\" is not a CPU number",
        ),
        (
            &["t", "--report", "/nonexistent-narad-dir/r.html"][..],
            "--report /nonexistent-narad-dir/r.html: cannot create the file",
        ),
        (
            &["t", "--json", "/nonexistent-narad-dir/r.json"][..],
            "--json /nonexistent-narad-dir/r.json: cannot write the file",
        ),
        (&["t", "--duration", "500ms"][..], "--duration must be 1 to"),
        // A CPU the machine lacks is refused before the run starts.
        (
            &["t", "--cpus", "0,1000"][..],
            "--cpus \"0,1000\": CPU 1000 is not one this process may run on (it may run on ",
        ),
        (
            &["t", "--cpus", "1000"][..],
            "--cpus \"1000\": CPU 1000 is not one this process may run on (it may run on ",
        ),
    ] {
        let output = bench(&node, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let lines = stderr_lines(&output);
        assert!(lines.last().unwrap().contains(expected), "{lines:#?}");
        assert!(
            !lines.iter().any(|l| l.contains("producing")),
            "{args:?} started a run: {lines:#?}"
        );
    }
}

/// `--duration` and `--timeout` take whole seconds or a Go duration; anything
/// else is a usage error naming the flag.
#[test]
fn bench_lengths_that_are_not_durations_are_refused() {
    let node = Node::start(&[]);
    for (flag, value) in [
        ("--duration", "3x"),
        ("--timeout", "1.5"),
        ("--duration", ""),
    ] {
        let output = bench(&node, &["t", flag, value]);
        assert_eq!(output.status.code(), Some(2), "{flag} {value:?}");
        let text = String::from_utf8_lossy(&output.stderr);
        assert!(
            text.contains(&format!("invalid value '{value}' for '{flag} <DURATION>'")),
            "{flag} {value:?}: {text}"
        );
    }
}

#[test]
fn a_flow_run_consumes_every_record_it_produced() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("flow.json");
    let report = dir.path().join("flow.html");
    let report_arg = report.to_str().unwrap();
    let runs: [&[&str]; 2] = [
        &[
            "flow",
            "--create",
            "--mode",
            "flow",
            "--verify",
            // A Go duration, as the broker's `wait` takes one; a bare number
            // is seconds (the run below).
            "--duration",
            "2s",
            "--report",
            report_arg,
        ],
        // Batch produce, batch consume and batch ack, on a fresh topic.
        &[
            "--max",
            "20",
            "--batch",
            "10",
            "--verify",
            "--duration",
            "2",
        ],
    ];
    for args in runs {
        let started = Instant::now();
        let output = bench(
            &node,
            &[
                args,
                &[
                    "--workers",
                    "4",
                    "--size",
                    "100",
                    "--json",
                    json.to_str().unwrap(),
                ],
            ]
            .concat(),
        );
        let lines = stderr_lines(&output);
        assert!(output.status.success(), "{args:?}: {lines:#?}");
        // Standard error is a pipe here: no status line, no control codes.
        assert!(
            !output.stderr.iter().any(|&b| b == b'\r' || b == 0x1b),
            "{lines:#?}"
        );
        assert!(started.elapsed() < Duration::from_secs(15), "{lines:#?}");
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(summary["mode"], "flow");
        assert_eq!(summary["ended"], "completed");
        assert!(summary["consumed"].as_u64().unwrap() > 0, "{summary}");
        assert_eq!(summary["missing"], 0, "{summary}");
        assert_eq!(summary["failed"], 0, "{summary}");
        assert_eq!(summary["damaged"], 0, "{summary}");
        assert!(
            summary["consumed"].as_u64().unwrap() >= summary["ok"].as_u64().unwrap(),
            "{summary}"
        );
        assert!(summary["e2e_latency"]["count"].as_u64().unwrap() > 0);
        assert!(summary["consume_latency"]["count"].as_u64().unwrap() > 0);
        assert!(
            lines.iter().any(|l| l.starts_with("verify: ")),
            "{lines:#?}"
        );
    }
    // The first run wrote its report: a page with the per-second charts of
    // both latencies and of throughput, and the percentile plot.
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert_eq!(page.matches("<svg").count(), 4, "{page}");
    assert!(page.contains("Produce-ack latency, per second"), "{page}");
    assert!(page.contains("End-to-end latency, per second"), "{page}");
    assert!(page.contains("<td>flow</td>"), "{page}");
    assert!(!page.contains("<script") && !page.contains("https://"));

    // The fresh topic is gone; the named one stays.
    let listed = node
        .served_client()
        .request("GET", "/v1/topics", &[], "")
        .unwrap();
    let topics: serde_json::Value = serde_json::from_str(&listed.body).unwrap();
    let names: Vec<&str> = topics["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["flow"]);
}

/// The figures of a run's `--json` file.
fn json_summary(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_counted_consume_run_acks_exactly_its_count() {
    let node = Node::start(&[]);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("run.json");
    let json_arg = json.to_str().unwrap();
    let produced = bench(
        &node,
        &[
            "cc",
            "--create",
            "--partitions",
            "3",
            "--count",
            "60",
            "--size",
            "50",
        ],
    );
    assert!(produced.status.success(), "{:#?}", stderr_lines(&produced));
    await_committed(&node, "cc", 60);

    // Eight consumers asking for up to 7 each: the last claims ask for less.
    let args = ["cc", "--mode", "consume", "--workers", "8", "--max", "7"];
    let counted = bench(
        &node,
        &[&args[..], &["--count", "25", "--json", json_arg]].concat(),
    );
    assert!(counted.status.success(), "{:#?}", stderr_lines(&counted));
    let summary = json_summary(&json);
    assert_eq!(summary["consumed"], 25, "{summary}");

    // What the counted run left is all still there.
    let rest = bench(&node, &[&args[..], &["--json", json_arg]].concat());
    assert!(rest.status.success(), "{:#?}", stderr_lines(&rest));
    let summary = json_summary(&json);
    assert_eq!(summary["consumed"], 35, "{summary}");
}

/// The broker's count of `GET /healthz` answered 200, from `/metrics`. The
/// node is up, so this asks at once rather than through `served_client`,
/// whose own `/healthz` probe would count.
fn healthz_served(node: &Node) -> u64 {
    let response = node.client().request("GET", "/metrics", &[], "").unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    response
        .body
        .lines()
        .filter(|line| {
            line.starts_with("narad_http_requests_total{")
                && line.contains("route=\"/healthz\"")
                && line.contains("status=\"200\"")
        })
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn a_ping_run_sends_healthz_and_takes_no_topic() {
    let node = Node::start(&[]);
    let before = healthz_served(&node);
    let output = bench(
        &node,
        &[
            "--mode",
            "ping",
            "--count",
            "3000",
            "--workers",
            "8",
            "--json",
        ],
    );
    let lines = stderr_lines(&output);
    assert!(output.status.success(), "{lines:#?}");
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[2].starts_with("ping figures: "), "{lines:#?}");
    assert_eq!(lines[0], "pinging /healthz 3000 times with 8 workers...");
    assert!(
        lines[1].starts_with("ping: 3000 ok, 0 failed in ") && lines[1].contains(" req/s; "),
        "{lines:#?}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["mode"], "ping");
    assert_eq!(summary["ok"], 3000);
    assert_eq!(healthz_served(&node) - before, 3000);

    for (args, expected) in [
        (&["t", "--mode", "ping"][..], "--mode ping takes no TOPIC"),
        (
            &["--mode", "ping", "--consume"][..],
            "--consume means --mode flow",
        ),
        (
            &["--mode", "ping", "--max", "5"][..],
            "--max does not apply",
        ),
        (
            &["--mode", "ping", "--rate", "100"][..],
            "--rate does not apply",
        ),
    ] {
        let output = bench(&node, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let lines = stderr_lines(&output);
        assert!(lines.last().unwrap().contains(expected), "{lines:#?}");
    }
}

/// A timed open loop lasts its time: at a rate low enough that its last
/// request goes well before the end, the achieved rate is still the records
/// over the whole run, not over the time to the last answer.
#[test]
fn a_slow_open_loop_reports_its_rate_over_the_whole_run() {
    let node = Node::start(&[]);
    let output = bench(
        &node,
        &[
            "paced",
            "--create",
            "--rate",
            "2",
            "--duration",
            "3",
            "--json",
            "-",
        ],
    );
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let seconds = summary["seconds"].as_f64().unwrap();
    let rate = summary["rate"].as_f64().unwrap();
    assert!(seconds >= 3.0, "{summary}");
    assert!((1.5..=2.5).contains(&rate), "{summary}");
    let lines = stderr_lines(&output);
    assert!(
        lines.iter().any(|l| l.contains("msg/s (target 2.00)")),
        "{lines:#?}"
    );
    // In a flow, consumers that keep up finish with the last record: their
    // rate is over the producers' whole time too, not up to that record.
    let output = bench(
        &node,
        &[
            "paced-flow",
            "--create",
            "--mode",
            "flow",
            "--workers",
            "2",
            "--rate",
            "2",
            "--duration",
            "3",
            "--json",
            "-",
        ],
    );
    assert!(output.status.success(), "{:?}", stderr_lines(&output));
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let seconds = summary["consume_seconds"].as_f64().unwrap();
    let rate = summary["consumed_rate"].as_f64().unwrap();
    assert!(seconds >= 3.0, "{summary}");
    assert!((1.5..=2.5).contains(&rate), "{summary}");
}
