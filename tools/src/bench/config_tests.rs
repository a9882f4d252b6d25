//! Tests of the run settings: argument resolution, defaults and the relations
//! between flags that are refused.

use super::*;

/// A valid produce configuration the tests start from.
pub fn config() -> Config {
    Config {
        server: "http://127.0.0.1:7942".into(),
        topic: Some("t".into()),
        count: None,
        duration: None,
        size_bytes: None,
        workers: 8,
        producers: None,
        consumers: None,
        mode: None,
        consume: false,
        consume_max: None,
        verify: false,
        batch_records: None,
        rate: None,
        cpus: None,
        create: false,
        partitions: None,
        json: None,
        report: None,
        timeout: None,
    }
}

#[test]
fn modes_and_the_consume_alias() {
    let s = Settings::resolve(&config()).unwrap();
    assert_eq!(s.mode, Mode::Produce);
    assert_eq!((s.producers, s.consumers), (8, 0));
    assert_eq!(s.length, Length::Records(10_000));

    let alias = Settings::resolve(&Config {
        consume: true,
        ..config()
    })
    .unwrap();
    assert_eq!(alias.mode, Mode::Flow);
    assert_eq!((alias.producers, alias.consumers), (8, 8));

    let both = Config {
        consume: true,
        mode: Some(Mode::Flow),
        ..config()
    };
    assert_eq!(Settings::resolve(&both).unwrap().mode, Mode::Flow);
    let clash = Config {
        consume: true,
        mode: Some(Mode::Produce),
        ..config()
    };
    let err = Settings::resolve(&clash).unwrap_err();
    assert!(err.contains("--consume means --mode flow"), "{err}");

    let consume = Settings::resolve(&Config {
        mode: Some(Mode::Consume),
        consumers: Some(3),
        ..config()
    })
    .unwrap();
    assert_eq!((consume.producers, consume.consumers), (0, 3));
    assert_eq!(consume.length, Length::UntilIdle);
    assert_eq!(Mode::parse("flow"), Ok(Mode::Flow));
    assert!(Mode::parse("both").is_err());
}

#[test]
fn pools_default_to_workers_and_size_separately() {
    let s = Settings::resolve(&Config {
        mode: Some(Mode::Flow),
        workers: 64,
        consumers: Some(4),
        consume_max: Some(100),
        ..config()
    })
    .unwrap();
    assert_eq!((s.producers, s.consumers, s.consume_max), (64, 4, 100));
}

#[test]
fn no_topic_is_a_ten_second_flow_on_a_fresh_topic() {
    let s = Settings::resolve(&Config {
        topic: None,
        ..config()
    })
    .unwrap();
    assert!(s.fresh_topic && s.create);
    assert!(
        s.topic.starts_with("bench-") && s.topic.len() == 22,
        "{}",
        s.topic
    );
    assert_eq!(s.mode, Mode::Flow);
    assert_eq!(s.length, Length::Timed(FRESH_TOPIC_DURATION));
    let counted = Settings::resolve(&Config {
        topic: None,
        count: Some(50),
        ..config()
    })
    .unwrap();
    assert_eq!(counted.length, Length::Records(50));
    let consume = Config {
        topic: None,
        mode: Some(Mode::Consume),
        ..config()
    };
    assert!(Settings::resolve(&consume)
        .unwrap_err()
        .contains("needs a TOPIC"));
}

#[test]
fn conflicts_and_ranges_are_refused_with_the_flag_named() {
    type Change = fn(&mut Config);
    let cases: [(Change, &str); 16] = [
        (|c| c.rate = Some(1e-17), "--rate must be 0.001 to"),
        // The pool that takes --workers names --workers.
        (|c| c.workers = 0, "--workers must be 1"),
        (
            |c| {
                c.consume = true;
                c.consume_max = Some(101)
            },
            "--max must be 1 to 100",
        ),
        (
            |c| {
                c.mode = Some(Mode::Consume);
                c.size_bytes = Some(256)
            },
            "--size applies to --mode produce or flow",
        ),
        (
            |c| {
                c.mode = Some(Mode::Flow);
                c.consume_max = Some(0)
            },
            "--max must be 1 to 100",
        ),
        (|c| c.consume_max = Some(5), "--max applies to"),
        (|c| c.consumers = Some(2), "--consumers applies to"),
        (|c| c.verify = true, "--verify applies to --mode flow"),
        (
            |c| {
                c.mode = Some(Mode::Consume);
                c.producers = Some(2)
            },
            "--producers applies",
        ),
        (
            |c| {
                c.mode = Some(Mode::Consume);
                c.batch_records = Some(2)
            },
            "--batch applies",
        ),
        (
            |c| {
                c.mode = Some(Mode::Flow);
                c.size_bytes = Some(54)
            },
            "in flow mode",
        ),
        (
            |c| {
                c.mode = Some(Mode::Flow);
                c.consumers = Some(0)
            },
            "--consumers must be 1",
        ),
        (
            |c| {
                c.count = Some(1);
                c.duration = Some(Duration::from_secs(1))
            },
            "exclude",
        ),
        (|c| c.partitions = Some(4), "--partitions applies"),
        (
            |c| {
                c.topic = None;
                c.partitions = Some(1)
            },
            "--partitions must be at least 3, got 1",
        ),
        (|c| c.topic = Some(String::new()), "empty"),
    ];
    for (change, expected) in cases {
        let mut bad = config();
        change(&mut bad);
        let err = Settings::resolve(&bad).unwrap_err();
        assert!(err.contains(expected), "{bad:?}: {err}");
    }
    let mut produce_small = config();
    produce_small.size_bytes = Some(12);
    assert!(Settings::resolve(&produce_small).is_ok());
}

#[test]
fn ping_mode_needs_no_topic_and_refuses_topic_flags() {
    let ping = Config {
        topic: None,
        mode: Some(Mode::Ping),
        ..config()
    };
    let s = Settings::resolve(&ping).unwrap();
    assert_eq!(s.mode, Mode::Ping);
    assert!(!s.fresh_topic && !s.create && s.topic.is_empty());
    assert_eq!((s.producers, s.consumers), (8, 0));
    assert_eq!(s.length, Length::Records(COUNT_DEFAULT));
    assert_eq!(Mode::parse("ping"), Ok(Mode::Ping));
    type Change = fn(&mut Config);
    let cases: [(Change, &str); 10] = [
        (|c| c.topic = Some("t".into()), "--mode ping takes no TOPIC"),
        (|c| c.consume = true, "--consume means --mode flow"),
        (|c| c.consumers = Some(2), "--consumers does not apply"),
        (|c| c.consume_max = Some(2), "--max does not apply"),
        (|c| c.verify = true, "--verify does not apply"),
        (|c| c.batch_records = Some(2), "--batch does not apply"),
        (|c| c.rate = Some(10.0), "--rate does not apply"),
        (|c| c.create = true, "--create does not apply"),
        (|c| c.partitions = Some(2), "--partitions does not apply"),
        (|c| c.size_bytes = Some(256), "--size does not apply"),
    ];
    for (change, expected) in cases {
        let mut bad = ping.clone();
        change(&mut bad);
        let err = Settings::resolve(&bad).unwrap_err();
        assert!(err.contains(expected), "{bad:?}: {err}");
    }
}

#[test]
fn cpu_lists_pin_to_their_first_cpu() {
    assert_eq!(parse_cpu_list("1"), Ok(vec![1]));
    assert_eq!(parse_cpu_list("0,2"), Ok(vec![0, 2]));
    assert_eq!(parse_cpu_list("2-3"), Ok(vec![2, 3]));
    assert_eq!(parse_cpu_list("3, 0-1"), Ok(vec![3, 0, 1]));
    assert_eq!(parse_cpu_list("4095"), Ok(vec![4095]));
    let pinned = Settings::resolve(&Config {
        cpus: Some("2-3".into()),
        ..config()
    })
    .unwrap();
    assert_eq!(pinned.cpus, [2, 3]);
    assert_eq!(pinned.pin_cpu(), Some(2));
    let free = Settings::resolve(&config()).unwrap();
    assert!(free.cpus.is_empty());
    assert_eq!(free.pin_cpu(), None);
}

#[test]
fn bad_cpu_lists_are_refused_with_the_flag_named() {
    for (list, why) in [
        ("", "\"\" is not a CPU number"),
        ("1,", "\"\" is not a CPU number"),
        ("a", "\"a\" is not a CPU number"),
        ("-1", "\"\" is not a CPU number"),
        ("1-2-3", "\"2-3\" is not a CPU number"),
        ("3-2", "the range 3-2 runs backwards"),
        ("0,1,0", "CPU 0 is listed twice"),
        ("1-3,2", "CPU 2 is listed twice"),
        ("4096", "CPU 4096 is not below 4096"),
        ("0-99999999", "CPU 99999999 is not below 4096"),
    ] {
        let err = parse_cpu_list(list).unwrap_err();
        assert!(err.starts_with(&format!("--cpus {list:?}: ")), "{err}");
        assert!(err.contains(why), "{list:?}: {err}");
        let bad = Config {
            cpus: Some(list.into()),
            ..config()
        };
        assert_eq!(Settings::resolve(&bad).unwrap_err(), err);
    }
}
