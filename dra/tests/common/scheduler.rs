//! What the scheduler makes of the slices the fake API server stored: the pool at its newest
//! generation (complete: all `resourceSliceCount` slices seen), and allocation of named devices
//! as the structured allocator does it, each device to one claim unless it allows multiple
//! allocations, and a device that consumes counters only while the counters its claims
//! consume fit its counter set (`k8s.io/dynamic-resource-allocation/structured`'s rules, as
//! far as these tests need them). Independent of the driver's own code.

use std::collections::BTreeMap;

use serde_json::Value;

pub struct Pool {
    pub devices: BTreeMap<String, Value>,
    /// counter set -> counter -> value.
    pub counters: BTreeMap<String, BTreeMap<String, u128>>,
}

fn amount(v: &Value) -> u128 {
    gpuslice_dra::quantity::parse(v["value"].as_str().unwrap()).unwrap() as u128
}

impl Pool {
    /// The pool `pool` of `driver` among `slices`; `Err` when it is incomplete or invalid
    /// (the scheduler then allocates nothing from it).
    pub fn of(slices: &BTreeMap<String, Value>, driver: &str, pool: &str) -> Result<Pool, String> {
        let ours: Vec<&Value> = slices
            .values()
            .filter(|s| s["spec"]["driver"] == driver && s["spec"]["pool"]["name"] == pool)
            .collect();
        let generation = ours
            .iter()
            .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
            .max()
            .ok_or("no slice")?;
        let newest: Vec<&Value> = ours
            .into_iter()
            .filter(|s| s["spec"]["pool"]["generation"] == generation)
            .collect();
        let count = newest[0]["spec"]["pool"]["resourceSliceCount"]
            .as_u64()
            .unwrap() as usize;
        if newest.len() != count {
            return Err(format!("incomplete: {} of {count} slices", newest.len()));
        }
        let mut devices = BTreeMap::new();
        let mut counters = BTreeMap::new();
        for slice in newest {
            for set in slice["spec"]["sharedCounters"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let values: BTreeMap<String, u128> = set["counters"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), amount(v)))
                    .collect();
                counters.insert(set["name"].as_str().unwrap().to_string(), values);
            }
            for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
                let name = device["name"].as_str().unwrap().to_string();
                if devices.insert(name.clone(), device.clone()).is_some() {
                    return Err(format!("device {name} twice"));
                }
            }
        }
        for (name, device) in &devices {
            for c in device["consumesCounters"].as_array().into_iter().flatten() {
                let set = c["counterSet"].as_str().unwrap();
                let known = counters
                    .get(set)
                    .ok_or(format!("{name}: no counter set {set}"))?;
                for key in c["counters"].as_object().unwrap().keys() {
                    if !known.contains_key(key) {
                        return Err(format!("{name}: no counter {key} in {set}"));
                    }
                }
            }
        }
        Ok(Pool { devices, counters })
    }

    /// Allocates `claims` (each a list of device names) one after the other; the index of the
    /// first claim that cannot be allocated, with why.
    pub fn allocate(&self, claims: &[&[&str]]) -> Result<(), (usize, String)> {
        let mut taken: Vec<&str> = Vec::new();
        let mut used: BTreeMap<(String, String), u128> = BTreeMap::new();
        for (n, claim) in claims.iter().enumerate() {
            for name in claim.iter() {
                let device = self
                    .devices
                    .get(*name)
                    .ok_or((n, format!("no device {name}")))?;
                let shared = device["allowMultipleAllocations"] == true;
                if !shared && taken.contains(name) {
                    return Err((n, format!("{name} is allocated already")));
                }
                for c in device["consumesCounters"].as_array().into_iter().flatten() {
                    let set = c["counterSet"].as_str().unwrap().to_string();
                    for (key, v) in c["counters"].as_object().unwrap() {
                        let sum = used.entry((set.clone(), key.clone())).or_default();
                        *sum += amount(v);
                        if *sum > self.counters[&set][key] {
                            return Err((n, format!("{name}: counter {set}/{key} exhausted")));
                        }
                    }
                }
                taken.push(name);
            }
        }
        Ok(())
    }
}
