use std::io::Cursor;

use proptest::prelude::*;

use super::*;

fn every_type() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-5)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(1.5)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo 🐬".into())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(-2.25)),
        ("arr.u8", Value::Array(Array::U8(vec![1, 2, 3]))),
        ("arr.i32", Value::Array(Array::I32(vec![-1, 0, 1]))),
        ("arr.bool", Value::Array(Array::Bool(vec![true, false]))),
        ("arr.f64", Value::Array(Array::F64(vec![0.5]))),
        (
            "arr.str",
            Value::Array(Array::String(vec!["a".into(), "".into(), "日本".into()])),
        ),
        ("arr.empty", Value::Array(Array::U64(vec![]))),
        (
            "arr.nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![7, 8]),
                Array::String(vec!["x".into()]),
            ])),
        ),
    ]
}

fn sample(version: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.version(version);
    for (k, v) in every_type() {
        w.add(k, v);
    }
    w.add_tensor("a", vec![4], GgmlType(0), vec![1; 16]);
    w.add_tensor("b", vec![32, 2], GgmlType(3), vec![2; 40]);
    w
}

fn read(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::read(
        Cursor::new(bytes),
        Some(bytes.len() as u64),
        Limits::default(),
    )
}

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    for version in [2, 3] {
        let bytes = sample(version).to_bytes();
        let g = read(&bytes).unwrap();
        assert_eq!(g.version, version);
        let got: Vec<(&str, &Value)> = g.metadata().collect();
        let want = every_type();
        assert_eq!(got.len(), want.len());
        for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
            assert_eq!(gk, wk);
            assert_eq!(*gv, wv);
        }
    }
}

#[test]
fn tensor_infos_and_data_offset() {
    let bytes = sample(3).to_bytes();
    let g = read(&bytes).unwrap();
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset % 32, 0);
    let b = g.tensor("b").unwrap();
    assert_eq!(b.shape, vec![32, 2]);
    assert_eq!(b.ggml_type.name(), Some("Q4_1"));
    assert_eq!(b.offset, 32, "a's 16 bytes padded to the alignment");
    let start = (g.data_offset + b.offset) as usize;
    assert_eq!(&bytes[start..start + 40], &[2u8; 40][..]);
    assert!(g.tensor("c").is_none());
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.alignment(64)
        .add_tensor("t", vec![3], GgmlType(0), vec![0; 12]);
    w.add_tensor("u", vec![1], GgmlType(0), vec![0; 4]);
    let g = read(&w.to_bytes()).unwrap();
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    assert_eq!(g.tensor("u").unwrap().offset, 64);
}

#[test]
fn typed_getters() {
    let g = read(&sample(3).to_bytes()).unwrap();
    assert_eq!(g.get_u32("u8").unwrap(), 200);
    assert_eq!(g.get_u32("u32").unwrap(), 4_000_000_000);
    assert!(matches!(g.get_u32("i8"), Err(GgufError::OutOfRange { .. })));
    assert!(matches!(
        g.get_u32("u64"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert_eq!(g.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(g.get_f64("f32").unwrap(), 1.5);
    assert!(g.get_bool("bool").unwrap());
    assert_eq!(g.get_str("string").unwrap(), "héllo 🐬");
    assert_eq!(g.get_str_array("arr.str").unwrap().len(), 3);
    assert!(matches!(
        g.get_str("u8"),
        Err(GgufError::WrongType {
            found: ValueType::U8,
            ..
        })
    ));
    assert!(matches!(
        g.get_str_array("arr.u8"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(g.get_str("nope"), Err(GgufError::MissingKey(_))));
    assert_eq!(optional(g.get_str("nope")).unwrap(), None);
    assert!(optional(g.get_str("u8")).is_err());
}

#[test]
fn open_reads_a_file_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, sample(3).to_bytes()).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.tensors.len(), 2);
    let missing = GgufFile::open(dir.path().join("absent.gguf")).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }), "{missing}");
}

#[test]
fn bad_magic_and_versions_are_rejected() {
    let mut bytes = sample(3).to_bytes();
    bytes[0] = b'X';
    assert!(matches!(read(&bytes), Err(GgufError::BadMagic(_))));
    for v in [1u32, 4, 0x0300_0000] {
        let mut bytes = sample(3).to_bytes();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(read(&bytes), Err(GgufError::UnsupportedVersion(x)) if x == v));
    }
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample(3).to_bytes();
    let g = read(&bytes).unwrap();
    // Every prefix shorter than the header fails; the alignment padding after it is not read.
    let parses =
        |cut: usize| GgufFile::read(Cursor::new(&bytes[..cut]), None, Limits::default()).is_ok();
    let header_end = (0..=g.data_offset as usize).find(|&c| parses(c)).unwrap();
    assert!(
        header_end as u64 > g.data_offset - g.alignment,
        "{header_end}"
    );
    assert!((header_end..=g.data_offset as usize).all(parses));
    // With the length known, tensor data past the end is caught as well.
    let err = read(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(matches!(err, GgufError::InvalidTensor { .. }), "{err}");
}

/// Header with one key whose value is built by `body` (after the type id).
fn one_kv(ty: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(body);
    b
}

#[test]
fn huge_declared_sizes_fail_before_allocating() {
    // An array claiming 2^60 u32 elements in a 40-byte file.
    let mut body = 4u32.to_le_bytes().to_vec();
    body.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let err = read(&one_kv(9, &body)).unwrap_err();
    assert!(matches!(err, GgufError::LimitExceeded { .. }), "{err}");
    // Within max_array_len but larger than the rest of the file.
    let mut body = 8u32.to_le_bytes().to_vec();
    body.extend_from_slice(&1_000_000u64.to_le_bytes());
    let err = read(&one_kv(9, &body)).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::LimitExceeded {
                what: "array length",
                ..
            }
        ),
        "{err}"
    );
    // A string length of 2^63 from a stream of unknown length: the limit alone stops it.
    let bytes = one_kv(8, &(1u64 << 63).to_le_bytes());
    let err = GgufFile::read(Cursor::new(&bytes), None, Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::LimitExceeded {
                what: "string length",
                ..
            }
        ),
        "{err}"
    );
    // Counts in the header itself.
    let mut bytes = sample(3).to_bytes();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(read(&bytes), Err(GgufError::LimitExceeded { .. })));
}

#[test]
fn header_memory_budget_is_enforced() {
    let mut w = GgufWriter::new();
    w.add("big", Value::Array(Array::U64(vec![0; 1000])));
    let limits = Limits {
        max_header_bytes: 4000,
        ..Limits::default()
    };
    let bytes = w.to_bytes();
    let err = GgufFile::read(Cursor::new(&bytes), None, limits).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::LimitExceeded {
                what: "header memory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn malformed_values_are_typed_errors() {
    assert!(matches!(
        read(&one_kv(13, &[])),
        Err(GgufError::UnknownValueType(13))
    ));
    assert!(matches!(
        read(&one_kv(7, &[2])),
        Err(GgufError::InvalidBool(2))
    ));
    let mut body = 2u64.to_le_bytes().to_vec();
    body.extend_from_slice(&[0xff, 0xfe]);
    assert!(matches!(
        read(&one_kv(8, &body)),
        Err(GgufError::InvalidUtf8 { .. })
    ));
    // Arrays nested past the depth limit.
    let mut deep = Array::U8(vec![1]);
    for _ in 0..10 {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.add("deep", Value::Array(deep));
    let err = read(&w.to_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::LimitExceeded {
                what: "array nesting",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn duplicate_keys_and_bad_alignment_are_rejected() {
    let mut w = GgufWriter::new();
    w.add("a", Value::U8(1)).add("a", Value::U8(2));
    assert!(matches!(read(&w.to_bytes()), Err(GgufError::DuplicateKey(k)) if k == "a"));
    for bad in [Value::U32(0), Value::U32(48), Value::String("32".into())] {
        let mut w = GgufWriter::new();
        w.add(ALIGNMENT_KEY, bad);
        assert!(matches!(
            read(&w.to_bytes()),
            Err(GgufError::InvalidAlignment(_))
        ));
    }
}

#[test]
fn malformed_tensor_infos_are_rejected() {
    let mut w = GgufWriter::new();
    w.add_tensor("t", vec![1, 1, 1, 1, 1], GgmlType(0), vec![0; 4]);
    assert!(matches!(
        read(&w.to_bytes()),
        Err(GgufError::InvalidTensor { .. })
    ));
    let mut w = GgufWriter::new();
    w.add_tensor("t", vec![u64::MAX, 2], GgmlType(0), vec![]);
    assert!(matches!(
        read(&w.to_bytes()),
        Err(GgufError::InvalidTensor { .. })
    ));
    let mut w = GgufWriter::new();
    w.add_tensor("t", vec![1], GgmlType(0), vec![0; 4]);
    w.add_tensor("t", vec![1], GgmlType(0), vec![0; 4]);
    assert!(matches!(
        read(&w.to_bytes()),
        Err(GgufError::InvalidTensor { .. })
    ));
    // A misaligned offset: header (24 bytes), then name (8 + 1), dims (4 + 8), type (4): the
    // offset field starts at byte 49.
    let mut w = GgufWriter::new();
    w.add_tensor("t", vec![1], GgmlType(0), vec![0; 4]);
    let mut bytes = w.to_bytes();
    assert_eq!(bytes[49..57], 0u64.to_le_bytes());
    bytes[49..57].copy_from_slice(&4u64.to_le_bytes());
    let err = read(&bytes).unwrap_err();
    assert!(
        matches!(&err, GgufError::InvalidTensor { detail, .. } if detail.contains("multiple")),
        "{err}"
    );
}

proptest! {
    #[test]
    fn corrupted_files_never_panic(flips in proptest::collection::vec((0usize..2000, any::<u8>()), 1..8)) {
        let mut bytes = sample(3).to_bytes();
        let n = bytes.len();
        for (pos, val) in flips {
            bytes[pos % n] = val;
        }
        let _ = read(&bytes);
        let _ = GgufFile::read(Cursor::new(&bytes), None, Limits::default());
    }
}
