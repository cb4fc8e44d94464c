use ftlab_core::config::{Config, ConfigBuilder};

fn err(preset: &str, sets: &[&str]) -> String {
    let mut b = match ConfigBuilder::from_preset(preset) {
        Ok(b) => b,
        Err(e) => return e.to_string(),
    };
    for s in sets {
        if let Err(e) = b.set(s) {
            return e.to_string();
        }
    }
    b.build().expect_err("config must be rejected").to_string()
}

#[test]
fn impossible_configs_name_the_key_and_why() {
    assert!(err("femu", &["flash.superblock_dies=3"]).contains("flash.superblock_dies"));
    assert!(err("femu", &["flash.page_size_bytes=3000"]).contains("flash.page_size_bytes"));
    assert!(err("femu", &["flash.channels=0"]).contains("flash.channels"));
    assert!(err("femu", &["capacity.over_provisioning=0.0001"]).contains("raise over-provisioning"));
    assert!(err("femu", &["capacity.spare_factor=1.5"]).contains("capacity.spare_factor"));
    // A capacity of no page is named by the key that gave it, not told to raise over-provisioning.
    for key in [
        "capacity.over_provisioning=1e30",
        "capacity.spare_factor=0.9999999999",
    ] {
        let e = err("femu", &[key]);
        let name = key.split('=').next().unwrap();
        assert!(
            e.contains(&format!("`{name}`: leaves no logical page")),
            "{e}"
        );
    }
    assert!(err("femu", &["ftl.gc_thres_pcent_high=50"]).contains("ftl.gc_thres_pcent_high"));
    assert!(err("femu", &["ftl.mapping=btree"]).contains("ftl.mapping"));
    assert!(err("femu", &["ftl.learned_buffer_divisor=12"]).contains("ftl.learned_buffer_divisor"));
    assert!(err("femu", &["workload.kind=bursty"]).contains("workload.kind"));
    assert!(err("femu", &["workload.read_pcent=140"]).contains("workload.read_pcent"));
    assert!(err("femu", &["workload.queue_depth=0"]).contains("workload.queue_depth"));
    assert!(err("femu", &["flash.chanels=4"]).contains("chanels"));
    assert!(err("femu", &["flash.channels=many"]).contains("channels"));
    assert!(err("femu", &["nonsense"]).contains("key=value"));
    // An unknown section is named as itself, not as the section before it.
    assert!(err("femu", &["flsh.channels=4"]).contains("config key `flsh`"));
    assert!(err("femu", &["ftl.gc.x=1"]).contains("config key `ftl.gc`"));
    assert!(err("nope", &[]).contains("unknown preset"));
}

#[test]
fn a_file_giving_two_capacity_keys_is_rejected() {
    let mut b = ConfigBuilder::from_preset("femu").unwrap();
    b.merge_str(
        "[capacity]\nover_provisioning = 0.2\nspare_factor = 0.1\n",
        "test.toml",
    )
    .unwrap();
    assert!(b.build().unwrap_err().to_string().contains("exactly one"));
}

#[test]
fn over_provisioning_is_accepted_both_ways() {
    let rho = Config::from_preset("validation-uniform").unwrap();
    let mut b = ConfigBuilder::from_preset("validation-uniform").unwrap();
    // spare factor = rho / (1 + rho)
    b.set(&format!("capacity.spare_factor={}", 0.07 / 1.07))
        .unwrap();
    let sf = b.build().unwrap();
    let (a, b) = (rho.geometry().unwrap(), sf.geometry().unwrap());
    assert!((a.logical_pages as i64 - b.logical_pages as i64).abs() <= 1);
    assert_eq!(a.physical_pages, 8192 * 256);
}

#[test]
fn presets_match_their_sources() {
    let femu = Config::from_preset("femu").unwrap().geometry().unwrap();
    assert_eq!(
        (femu.dies, femu.physical_bytes(), femu.logical_bytes()),
        (64, 16 << 30, 12 << 30)
    );
    // FEMU: gc_thres_lines = (1 - 0.75) * 256 = 64, high = (1 - 0.95) * 256 = 12.
    assert_eq!(femu.gc_background_free_superblocks, Some(64));
    assert_eq!(femu.gc_foreground_free_superblocks, Some(12));
    let hexa = Config::from_preset("hexa").unwrap();
    assert_eq!(
        (
            hexa.flash.page_size_bytes,
            hexa.flash.read_latency_ns,
            hexa.flash.program_latency_ns
        ),
        (8192, 60_000, 700_000)
    );
    let v = Config::from_preset("validation-uniform")
        .unwrap()
        .geometry()
        .unwrap();
    assert_eq!((v.physical_pages, v.pages_per_superblock), (2 << 20, 256));
}

#[test]
fn resolved_config_round_trips_through_toml() {
    let c = Config::from_preset("hexa").unwrap();
    let mut b = ConfigBuilder::from_preset("femu").unwrap();
    b.merge_str(&c.to_toml(), "resolved").unwrap();
    assert_eq!(b.build().unwrap(), c);
}

#[test]
fn the_generator_is_checked_only_where_it_runs() {
    // hexa's workload spans 4 GiB; a 1 GiB device cannot run it...
    let small = "capacity.logical_bytes=1073741824";
    let e = err("hexa", &[small]);
    assert!(
        e.contains("workload.span_bytes") && e.contains("0 = the whole device"),
        "{e}"
    );
    // ...but it can replay a trace, which replaces the generator,
    let mut b = ConfigBuilder::from_preset("hexa").unwrap();
    b.set(small).unwrap();
    b.set("workload.trace=\"t.csv\"").unwrap();
    assert!(b.build().is_ok());
    // and serve hosts, which never read the workload section.
    let mut b = ConfigBuilder::from_preset("hexa").unwrap();
    b.set(small).unwrap();
    b.set("workload.kind=\"bursty\"").unwrap();
    let served = b.clone().build_device().unwrap();
    assert_eq!(served.geometry().unwrap().logical_bytes(), 1 << 30);
    assert!(b.build().unwrap_err().to_string().contains("workload.kind"));
    // What the device itself needs is still checked.
    let mut b = ConfigBuilder::from_preset("hexa").unwrap();
    b.set("flash.channels=0").unwrap();
    assert!(b
        .build_device()
        .unwrap_err()
        .to_string()
        .contains("flash.channels"));
}

/// A number out of range is refused with the key and the range, not as "a string where an
/// integer was expected" (TOML holds integers up to 2^63 - 1; larger ones used to become
/// strings).
#[test]
fn numbers_out_of_range_are_refused_with_the_key_and_the_range() {
    let e = err("femu", &["capacity.logical_bytes=18446744073709551615"]);
    assert!(
        e.contains("capacity.logical_bytes")
            && e.contains("must be between")
            && e.contains("9223372036854775807"),
        "{e}"
    );
    assert!(!e.contains("string"), "{e}");
    // Negative where only positive makes sense: refused as a value, with the key.
    let e = err("femu", &["capacity.logical_bytes=-1"]);
    assert!(
        e.contains("capacity.logical_bytes") && e.contains("-1"),
        "{e}"
    );
}

#[test]
fn negative_flag_values_are_refused_as_values() {
    for (flag, value, says) in [
        ("--seed", "-1", "not in 0..=9223372036854775807"),
        ("--time-scale", "-1", "workload.time_scale"),
    ] {
        let (ok, _, stderr) = crate::support::ftlab(&["sim", "-q", flag, value]);
        assert!(!ok, "{flag} {value}");
        assert!(!stderr.contains("unexpected argument"), "{stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
}
