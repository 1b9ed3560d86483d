//! What the control server and its clients exchange over HTTP+JSON, and
//! the group-port syntax the control server and the reflectors share:
//! - [`JoinGrant`]: the answer to `GET /join?player=ID&x=X&y=Y` (the
//!   player's group and a signed join token with its session key);
//! - [`EpochKeyGrant`], [`KeyedGrant`], [`KeyedAreaGrant`] and
//!   [`KeysAnswer`]: the sealing epoch keys a control server with a sealing
//!   secret adds to each grant, and the answer to `GET /keys`
//!   (docs/protocol.md, "Handing out keys");
//! - [`WorldInfo`]: the part of `GET /world` a client needs to move around;
//! - [`area_cells`] and [`area_grant_cells`]: which cells an area of
//!   interest covers and which of them its answer grants, in order;
//! - [`parse_ports`]: `4000-4015,5000`, as `reflector serve --ports` and the
//!   control server's `--reflector IP:PORTS` take it.
//!
//! The JSON field names are the wire format of the control server: they
//! are the Rust field names, unchanged from the control server's first
//! version, and a renamed field here would break every deployed client.

use serde::{Deserialize, Serialize};

/// The answer to `GET /join`: where the player's group is and the join
/// token that opens it. (A *ticket*, by contrast, is the JWT a game backend
/// gives a player to ask for this.)
///
/// Its JSON fields are named as its Rust fields, as they always were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinGrant {
    pub player: u32,
    pub cell: [u32; 2],
    /// `ip:port` of the group to send to.
    pub reflector: String,
    /// Which reflector (position of its `--reflector` option); the token is bound to it.
    pub reflector_id: u16,
    /// The group id, which is the reflector port.
    pub group: u16,
    /// The join token, hex.
    pub token: String,
    /// The session key for this token, hex (32 bytes): it MACs the player's
    /// datagrams, so it travels only here, over the control channel.
    pub session_key: String,
    pub expires_unix_s: u64,
}

/// `GET /join?...&area=R`'s answer (docs/protocol.md, "Area of
/// interest"): the player's own cell's grant, with its fields at the top
/// level as in a plain join's answer, and one grant per other group serving
/// a cell of the area, nearest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AreaGrant {
    #[serde(flatten)]
    pub cell: JoinGrant,
    #[serde(default)]
    pub area: Vec<JoinGrant>,
}

/// One epoch key as the control server hands it out (docs/protocol.md,
/// "Handing out keys"): the key `E(c, e)` of one cell and epoch, and when
/// that epoch starts and ends (the next epoch's start), Unix seconds.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochKeyGrant {
    /// `[column, row]`.
    pub cell: [u32; 2],
    /// The 8-byte cell id, hex.
    pub cell_id: String,
    pub epoch: u32,
    /// The 32-byte epoch key, hex.
    pub key: String,
    pub starts_unix_s: u64,
    pub ends_unix_s: u64,
}

impl std::fmt::Debug for EpochKeyGrant {
    // A key never goes to a log through a Debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochKeyGrant")
            .field("cell", &self.cell)
            .field("cell_id", &self.cell_id)
            .field("epoch", &self.epoch)
            .field("starts_unix_s", &self.starts_unix_s)
            .field("ends_unix_s", &self.ends_unix_s)
            .finish_non_exhaustive()
    }
}

/// A grant and the epoch keys of the cells its group serves: what a
/// control server with a sealing secret answers for each group (`keys`
/// absent, so empty here, from one without). A reader of [`JoinGrant`]
/// reads the same JSON and ignores `keys`.
///
/// With `sign_key` in the request (docs/protocol.md, "Handing out keys"),
/// such a server also certifies the player's Ed25519 key: `control_public`
/// (the world's control key, hex) and `certificate` (its signature over the
/// player, the key and `expires_unix_s`, hex). Both are absent otherwise,
/// and readers written before them ignore them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedGrant {
    #[serde(flatten)]
    pub grant: JoinGrant,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<EpochKeyGrant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_public: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
}

/// [`AreaGrant`] with each grant's epoch keys: the whole `/join` answer of
/// a control server with a sealing secret (a plain answer has no `area`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedAreaGrant {
    #[serde(flatten)]
    pub cell: KeyedGrant,
    #[serde(default)]
    pub area: Vec<KeyedGrant>,
}

/// The answer to `GET /keys?token=T&at=A&mac=M`: the epoch keys of the
/// cells the token's group serves now (none if it serves none: its cells
/// moved, and a MOVED tells its members where).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysAnswer {
    pub player: u32,
    pub group: u16,
    #[serde(default)]
    pub keys: Vec<EpochKeyGrant>,
}

/// The cells of an area of interest (docs/protocol.md, "Area of interest"),
/// in the order the control server grants them: every cell of the
/// `grid` (`[columns, rows]`) within `radius` cells of `center` in both
/// directions (the square of side 2R+1, cut at the world's edges), `center`
/// itself left out, nearest first by ring (the larger of the column and row
/// distances), then by row, then by column.
pub fn area_cells(grid: [u32; 2], center: [u32; 2], radius: u32) -> Vec<[u32; 2]> {
    let [cols, rows] = grid;
    if cols == 0 || rows == 0 {
        return Vec::new();
    }
    let span = |c: u32, n: u32| c.saturating_sub(radius)..=c.saturating_add(radius).min(n - 1);
    let mut cells: Vec<[u32; 2]> = span(center[1], rows)
        .flat_map(|y| span(center[0], cols).map(move |x| [x, y]))
        .filter(|&c| c != center)
        .collect();
    cells.sort_by_key(|&[x, y]| (x.abs_diff(center[0]).max(y.abs_diff(center[1])), y, x));
    cells
}

/// The cells an area's answer grants, in order: of [`area_cells`], the first
/// cell of each group (`group_of` names a cell's group; two cells are the
/// same group when it returns equal values), skipping the center's own group.
pub fn area_grant_cells<G: PartialEq>(
    grid: [u32; 2],
    center: [u32; 2],
    radius: u32,
    mut group_of: impl FnMut([u32; 2]) -> G,
) -> Vec<[u32; 2]> {
    let mut seen = vec![group_of(center)];
    let mut granted = Vec::new();
    for cell in area_cells(grid, center, radius) {
        let g = group_of(cell);
        if !seen.contains(&g) {
            seen.push(g);
            granted.push(cell);
        }
    }
    granted
}

/// The world as `GET /world` describes it (what bots need to move around).
/// The answer has more fields (the mapping); these are the ones a client
/// reads, under their JSON names.
#[derive(Debug, Clone, Deserialize)]
pub struct WorldInfo {
    pub grid: [u32; 2],
    pub cell_size: f64,
    pub size: [f64; 2],
}

/// Group ports, each one group, sorted and distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortList(pub Vec<u16>);

/// Parses `4000-4015,5000` into a sorted list of distinct ports.
pub fn parse_ports(s: &str) -> Result<PortList, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parse = |t: &str| {
            t.trim()
                .parse::<u16>()
                .map_err(|_| format!("'{t}' in '{s}' is not a port number (1-65535)"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse(a)?, parse(b)?);
                if a == 0 || b < a {
                    return Err(format!("port range '{part}' is empty or starts at 0"));
                }
                out.extend(a..=b);
            }
            None => {
                let p = parse(part)?;
                if p == 0 {
                    return Err("port 0 is not a group port".into());
                }
                out.push(p);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.is_empty() {
        return Err(format!("no ports in '{s}'"));
    }
    if out.len() > 4096 {
        return Err(format!(
            "{} ports requested; at most 4096 groups per reflector",
            out.len()
        ));
    }
    Ok(PortList(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_lists() {
        assert_eq!(parse_ports("4000-4002").unwrap().0, vec![4000, 4001, 4002]);
        assert_eq!(parse_ports("5000, 4000-4001,4000").unwrap().0, vec![4000, 4001, 5000]);
        assert!(parse_ports("4002-4000").unwrap_err().contains("empty"));
        assert!(parse_ports("abc").unwrap_err().contains("not a port"));
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("70000").is_err());
        assert!(parse_ports("").is_err());
        assert!(parse_ports("1-65535").unwrap_err().contains("4096"));
    }

    #[test]
    fn join_grant_json_keeps_its_field_names() {
        let g = JoinGrant {
            player: 42,
            cell: [1, 0],
            reflector: "10.0.0.1:4001".into(),
            reflector_id: 0,
            group: 4001,
            token: "ab".into(),
            session_key: "cd".into(),
            expires_unix_s: 1_060,
        };
        let v = serde_json::to_value(&g).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cell",
                "expires_unix_s",
                "group",
                "player",
                "reflector",
                "reflector_id",
                "session_key",
                "token"
            ]
        );
        assert_eq!(serde_json::from_value::<JoinGrant>(v).unwrap(), g);
    }

    #[test]
    fn an_area_answer_reads_as_a_plain_one_too() {
        let g = |group: u16| JoinGrant {
            player: 42,
            cell: [1, 0],
            reflector: "10.0.0.1:4001".into(),
            reflector_id: 0,
            group,
            token: "ab".into(),
            session_key: "cd".into(),
            expires_unix_s: 1_060,
        };
        let a = AreaGrant {
            cell: g(4001),
            area: vec![g(4002), g(4003)],
        };
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["group"], 4001);
        assert_eq!(v["area"][1]["group"], 4003);
        // A reader of plain joins takes the player's own grant from it.
        assert_eq!(serde_json::from_value::<JoinGrant>(v.clone()).unwrap(), g(4001));
        assert_eq!(serde_json::from_value::<AreaGrant>(v).unwrap(), a);
        // And a plain answer is an area answer with no area.
        let plain = serde_json::to_value(g(4001)).unwrap();
        assert!(serde_json::from_value::<AreaGrant>(plain).unwrap().area.is_empty());
    }

    fn key(cell: [u32; 2], epoch: u32) -> EpochKeyGrant {
        EpochKeyGrant {
            cell,
            cell_id: "9a1f03c200030001".into(),
            epoch,
            key: "ab".repeat(32),
            starts_unix_s: 1_767_498_021,
            ends_unix_s: 1_767_498_633,
        }
    }

    #[test]
    fn keys_ride_along_and_old_readers_ignore_them() {
        let g = |group: u16, keys: Vec<EpochKeyGrant>| KeyedGrant {
            grant: JoinGrant {
                player: 42,
                cell: [3, 1],
                reflector: "10.0.0.1:4001".into(),
                reflector_id: 0,
                group,
                token: "ab".into(),
                session_key: "cd".into(),
                expires_unix_s: 1_060,
            },
            keys,
            control_public: None,
            certificate: None,
        };
        let a = KeyedAreaGrant {
            cell: g(4001, vec![key([3, 1], 7), key([3, 1], 8)]),
            area: vec![g(4002, vec![key([2, 1], 7)])],
        };
        let v = serde_json::to_value(&a).unwrap();
        let mut fields: Vec<&str> = v["keys"][0].as_object().unwrap().keys().map(String::as_str).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["cell", "cell_id", "ends_unix_s", "epoch", "key", "starts_unix_s"],
            "the document's field names"
        );
        assert_eq!(v["area"][0]["keys"][0]["cell"], serde_json::json!([2, 1]));
        assert_eq!(serde_json::from_value::<KeyedAreaGrant>(v.clone()).unwrap(), a);
        // Readers written before sealing read the same answer.
        assert_eq!(serde_json::from_value::<JoinGrant>(v.clone()).unwrap(), a.cell.grant);
        assert_eq!(serde_json::from_value::<AreaGrant>(v).unwrap().area[0], a.area[0].grant);
        // Without a sealing secret the field is absent, and reads as empty.
        let plain = serde_json::to_value(g(4001, Vec::new())).unwrap();
        assert!(plain.get("keys").is_none(), "{plain}");
        assert!(plain.get("control_public").is_none() && plain.get("certificate").is_none());
        assert!(serde_json::from_value::<KeyedAreaGrant>(plain)
            .unwrap()
            .cell
            .keys
            .is_empty());
        // The key never shows in a Debug print.
        assert!(!format!("{:?}", key([3, 1], 7)).contains(&"ab".repeat(32)));
    }

    #[test]
    fn a_certificate_rides_along_and_old_readers_ignore_it() {
        let g = KeyedGrant {
            grant: JoinGrant {
                player: 42,
                cell: [3, 1],
                reflector: "10.0.0.1:4001".into(),
                reflector_id: 0,
                group: 4001,
                token: "ab".into(),
                session_key: "cd".into(),
                expires_unix_s: 1_060,
            },
            keys: vec![key([3, 1], 7)],
            control_public: Some("11".repeat(32)),
            certificate: Some("22".repeat(64)),
        };
        let a = KeyedAreaGrant {
            cell: g.clone(),
            area: vec![g.clone()],
        };
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["control_public"], "11".repeat(32));
        assert_eq!(v["area"][0]["certificate"], "22".repeat(64));
        assert_eq!(serde_json::from_value::<KeyedAreaGrant>(v.clone()).unwrap(), a);
        assert_eq!(serde_json::from_value::<JoinGrant>(v.clone()).unwrap(), g.grant);
        assert_eq!(serde_json::from_value::<AreaGrant>(v).unwrap().area[0], g.grant);
    }

    #[test]
    fn a_keys_answer_reads_back() {
        let k = KeysAnswer {
            player: 42,
            group: 4001,
            keys: vec![key([3, 1], 7)],
        };
        let v = serde_json::to_value(&k).unwrap();
        assert_eq!((v["player"].as_u64(), v["group"].as_u64()), (Some(42), Some(4001)));
        assert_eq!(serde_json::from_value::<KeysAnswer>(v).unwrap(), k);
    }
}
