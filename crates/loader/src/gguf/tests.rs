use super::*;
use crate::gguf_writer::GgufWriter;
use std::io::Write;

fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, WeightsError> {
    let f = write_tmp(bytes);
    GgufFile::open(f.path())
}

fn sample() -> GgufWriter {
    GgufWriter::new()
        .kv("general.architecture", GgufValue::String("llama".into()))
        .kv("u8", GgufValue::U8(7))
        .kv("i8", GgufValue::I8(-7))
        .kv("u16", GgufValue::U16(700))
        .kv("i16", GgufValue::I16(-700))
        .kv("u32", GgufValue::U32(70_000))
        .kv("i32", GgufValue::I32(-70_000))
        .kv("u64", GgufValue::U64(1 << 40))
        .kv("i64", GgufValue::I64(-(1 << 40)))
        .kv("f32", GgufValue::F32(1.5))
        .kv("f64", GgufValue::F64(-2.25))
        .kv("bool", GgufValue::Bool(true))
        .kv("strs", GgufValue::Array(GgufArray::String(vec!["a".into(), "".into(), "héllo".into()])))
        .kv("f32s", GgufValue::Array(GgufArray::F32(vec![0.5, -1.0])))
        .kv("i32s", GgufValue::Array(GgufArray::I32(vec![1, -2, 3])))
        .kv("nested", GgufValue::Array(GgufArray::Array(vec![GgufArray::U8(vec![1, 2]), GgufArray::Bool(vec![])])))
        .tensor_f32("a", &[4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.])
        .tensor("q", DType::Q8_0, &[32], vec![3u8; 34])
        .tensor_f32("b", &[3], &[9., 8., 7.])
}

#[test]
fn reads_every_value_type_and_tensor() {
    let g = open_bytes(&sample().to_bytes()).unwrap();
    let md = g.metadata();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(md.get("u8"), Some(&GgufValue::U8(7)));
    assert_eq!(md.get("i8"), Some(&GgufValue::I8(-7)));
    assert_eq!(md.get_u64("u16"), Some(700));
    assert_eq!(md.get("i16"), Some(&GgufValue::I16(-700)));
    assert_eq!(md.get_u64("u32"), Some(70_000));
    assert_eq!(md.get_u64("i32"), None, "negative ints are not u64");
    assert_eq!(md.get_f64("i32"), Some(-70_000.0));
    assert_eq!(md.get_u64("u64"), Some(1 << 40));
    assert_eq!(md.get("i64"), Some(&GgufValue::I64(-(1 << 40))));
    assert_eq!(md.get_f64("f32"), Some(1.5));
    assert_eq!(md.get_f64("f64"), Some(-2.25));
    assert_eq!(md.get_bool("bool"), Some(true));
    assert_eq!(md.get_str_array("strs").unwrap(), &["a", "", "héllo"]);
    assert_eq!(md.get_f32_array("f32s").unwrap(), &[0.5, -1.0]);
    assert_eq!(md.get_i32_array("i32s").unwrap(), &[1, -2, 3]);
    assert_eq!(md.get_array("nested").unwrap().len(), 2);
    assert_eq!(md.iter().count(), 16);
    assert_eq!(md.iter().next().unwrap().0, "general.architecture");

    let names: Vec<_> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "q", "b"]);
    let a = g.info("a").unwrap();
    assert_eq!(a.shape, vec![2, 4], "shape is outermost-first");
    assert_eq!(g.tensor("a").unwrap().ne, vec![4, 2]);
    let bytes = g.bytes("a").unwrap();
    let vals: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(vals, [0., 1., 2., 3., 4., 5., 6., 7.]);
    assert_eq!(g.bytes("q").unwrap(), &[3u8; 34][..]);
    assert_eq!(g.bytes("b").unwrap().len(), 12);
    assert_eq!(g.tensor("b").unwrap().offset % 32, 0);
    let e = g.bytes("nope").unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("nope"));
}

#[test]
fn custom_alignment_is_honoured() {
    let w = GgufWriter::new().alignment(64).tensor_f32("x", &[3], &[1., 2., 3.]).tensor_f32("y", &[1], &[4.]);
    let g = open_bytes(&w.to_bytes()).unwrap();
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    assert_eq!(g.tensor("y").unwrap().offset, 64);
    assert_eq!(g.bytes("y").unwrap(), &4f32.to_le_bytes());
}

fn err_of(bytes: &[u8]) -> WeightsError {
    open_bytes(bytes).expect_err("expected an error")
}

#[test]
fn rejects_bad_headers() {
    assert!(err_of(b"").problem.contains("not a GGUF file"));
    assert!(err_of(b"GGML\x03\0\0\0").problem.contains("magic"));
    let mut v1 = sample().to_bytes();
    v1[4] = 1;
    assert!(err_of(&v1).problem.contains("version 1"));
    let mut be = sample().to_bytes();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err_of(&be).problem.contains("big-endian"));
    let mut v9 = sample().to_bytes();
    v9[4] = 9;
    assert!(err_of(&v9).problem.contains("unsupported GGUF version 9"));
    // An absurd metadata count is refused before any allocation.
    let mut huge = sample().to_bytes();
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_of(&huge).problem.contains("metadata count"));
    let mut huge_t = sample().to_bytes();
    huge_t[8..16].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(err_of(&huge_t).problem.contains("tensor count"));
}

#[test]
fn rejects_bad_metadata() {
    let e = err_of(&GgufWriter::new().kv("k", GgufValue::U8(1)).kv("k", GgufValue::U8(2)).to_bytes());
    assert!(e.problem.contains("duplicate metadata key 'k'"), "{e}");
    let e = err_of(&GgufWriter::new().alignment(3).to_bytes());
    assert!(e.problem.contains("power of two"), "{e}");
    // Unknown value type 13 in place of the U8 type id.
    let mut b = GgufWriter::new().kv("k", GgufValue::U8(1)).to_bytes();
    let at = 24 + 8 + 1;
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(err_of(&b).problem.contains("unknown value type 13"));
    // A string length larger than the file.
    let mut b = GgufWriter::new().kv("k", GgufValue::String("abc".into())).to_bytes();
    b[at + 4..at + 12].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = err_of(&b);
    assert!(e.problem.contains("metadata 'k'") && e.problem.contains("truncated"), "{e}");
    // An array count larger than the file.
    let mut b = GgufWriter::new().kv("k", GgufValue::Array(GgufArray::F32(vec![1.0]))).to_bytes();
    b[at + 8..at + 16].copy_from_slice(&(1u64 << 61).to_le_bytes());
    assert!(err_of(&b).problem.contains("cannot fit"));
    // Invalid UTF-8 in a key.
    let mut b = GgufWriter::new().kv("kk", GgufValue::U8(1)).to_bytes();
    b[32] = 0xff;
    assert!(err_of(&b).problem.contains("invalid UTF-8"));
    // Invalid bool byte.
    let mut b = GgufWriter::new().kv("k", GgufValue::Bool(true)).to_bytes();
    b[at + 4] = 2;
    assert!(err_of(&b).problem.contains("invalid bool"));
}

#[test]
fn rejects_bad_tensors_naming_them() {
    let e = err_of(&GgufWriter::new().tensor("w", DType::F32, &[2, 2], vec![0; 8]).to_bytes());
    assert_eq!(e.tensor.as_deref(), Some("w"));
    assert!(e.problem.contains("past the end"), "{e}");
    let e = err_of(&GgufWriter::new().tensor("w", DType::Q4_0, &[16], vec![0; 18]).to_bytes());
    assert!(e.problem.contains("block size 32"), "{e}");
    let e = err_of(&GgufWriter::new().tensor("w", DType::F32, &[1, 0], vec![]).to_bytes());
    assert!(e.problem.contains("zero-sized"), "{e}");
    let e = err_of(&GgufWriter::new().tensor("w", DType::F32, &[1 << 40, 1 << 30], vec![]).to_bytes());
    assert!(e.problem.contains("absurd dimensions"), "{e}");
    let e = err_of(&GgufWriter::new().tensor("w", DType::F32, &[1, 1, 1, 1, 1], vec![0; 4]).to_bytes());
    assert!(e.problem.contains("5 dimensions"), "{e}");
    let e = err_of(&GgufWriter::new().tensor_f32("w", &[1], &[1.]).tensor_f32("w", &[1], &[1.]).to_bytes());
    assert!(e.problem.contains("duplicate tensor name"), "{e}");

    // Unsupported type: patch the type id of the only tensor to 29 (IQ1_M).
    let w = GgufWriter::new().tensor_f32("w", &[8], &[0.; 8]);
    let mut b = w.to_bytes();
    let type_at = 24 + 8 + 1 + 4 + 8;
    assert_eq!(&b[type_at..type_at + 4], &0u32.to_le_bytes());
    b[type_at..type_at + 4].copy_from_slice(&29u32.to_le_bytes());
    let e = err_of(&b);
    assert!(e.problem.contains("IQ1_M") && e.tensor.as_deref() == Some("w"), "{e}");
    // Misaligned offset.
    let mut b = w.to_bytes();
    b[type_at + 4..type_at + 12].copy_from_slice(&4u64.to_le_bytes());
    assert!(err_of(&b).problem.contains("alignment"));
    // Overlap: second tensor pointed at the first one's data.
    let w2 = GgufWriter::new().tensor_f32("x", &[8], &[0.; 8]).tensor_f32("y", &[8], &[0.; 8]);
    let mut b = w2.to_bytes();
    let y_off_at = 24 + (8 + 1 + 4 + 8 + 4 + 8) + (8 + 1 + 4 + 8 + 4);
    assert_eq!(&b[y_off_at..y_off_at + 8], &32u64.to_le_bytes());
    b[y_off_at..y_off_at + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = err_of(&b);
    assert!(e.problem.contains("overlaps"), "{e}");
}

/// IQ4_NL (type 20) and IQ4_XS (type 23) tensors are read with their types, shapes and bytes; their block
/// sizes (32 and 256) are enforced.
#[test]
fn reads_iq4_tensors() {
    let nl: Vec<u8> = (0..2 * 18).map(|i| i as u8).collect();
    let xs: Vec<u8> = (0..4 * 136).map(|i| (i * 7) as u8).collect();
    let w = GgufWriter::new().tensor("nl", DType::IQ4NL, &[64], nl.clone()).tensor(
        "xs",
        DType::IQ4XS,
        &[512, 2],
        xs.clone(),
    );
    let b = w.to_bytes();
    // The type ids as written: 20 and 23.
    let at = |name: &str| 24 + b[24..].windows(name.len()).position(|x| x == name.as_bytes()).unwrap() + name.len();
    let ids: Vec<u32> = ["nl", "xs"]
        .iter()
        .map(|n| {
            let dims = u32::from_le_bytes(b[at(n)..at(n) + 4].try_into().unwrap()) as usize;
            let t = at(n) + 4 + 8 * dims;
            u32::from_le_bytes(b[t..t + 4].try_into().unwrap())
        })
        .collect();
    assert_eq!(ids, [20, 23]);
    let g = open_bytes(&b).unwrap();
    let (inl, ixs) = (g.info("nl").unwrap(), g.info("xs").unwrap());
    assert_eq!((inl.dtype, inl.shape.as_slice()), (DType::IQ4NL, &[64u64][..]));
    assert_eq!((ixs.dtype, ixs.shape.as_slice()), (DType::IQ4XS, &[2u64, 512][..]));
    assert_eq!(g.bytes("nl").unwrap(), &nl[..]);
    assert_eq!(g.bytes("xs").unwrap(), &xs[..]);
    let e = err_of(&GgufWriter::new().tensor("w", DType::IQ4XS, &[128], vec![0; 68]).to_bytes());
    assert!(e.problem.contains("block size 256"), "{e}");
}

/// An IQ2_S tensor (type 22, 82-byte blocks of 256) is read with its type, shape and bytes; a row that is not a
/// whole block is refused.
#[test]
fn reads_iq2s_tensors() {
    let data: Vec<u8> = (0..3 * 82).map(|i| (i * 5) as u8).collect();
    let b = GgufWriter::new().tensor("s", DType::IQ2S, &[256, 3], data.clone()).to_bytes();
    // Header (24), name length and name (8 + 1), n_dims (4), two dims (16), then the type id.
    let t = 24 + 8 + 1 + 4 + 2 * 8;
    assert_eq!(u32::from_le_bytes(b[t..t + 4].try_into().unwrap()), 22);
    let g = open_bytes(&b).unwrap();
    let i = g.info("s").unwrap();
    assert_eq!((i.dtype, i.shape.as_slice()), (DType::IQ2S, &[3u64, 256][..]));
    assert_eq!(g.bytes("s").unwrap(), &data[..]);
    let e = err_of(&GgufWriter::new().tensor("w", DType::IQ2S, &[128], vec![0; 41]).to_bytes());
    assert!(e.problem.contains("block size 256"), "{e}");
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let full = sample().to_bytes();
    assert!(open_bytes(&full).is_ok());
    for len in 0..full.len() {
        let r = std::panic::catch_unwind(|| open_bytes(&full[..len]).map(|_| ()));
        match r {
            Ok(Err(e)) => assert!(!e.problem.is_empty()),
            Ok(Ok(())) => panic!("truncation to {len} bytes accepted"),
            Err(_) => panic!("truncation to {len} bytes panicked"),
        }
    }
}

/// Releasing a tensor's mapped pages (whole, part, twice) leaves its bytes readable and unchanged: they are read
/// back from the file.
#[test]
fn released_shared_bytes_read_back_the_same() {
    // `[2048][32]` Q8_0 blocks (69,632 bytes: whole pages inside it), distinct bytes per block.
    let rows = 2048;
    let data: Vec<u8> = (0..rows * 34).map(|i| (i * 131 % 251) as u8).collect();
    let g = open_bytes(&sample().tensor("big", DType::Q8_0, &[rows as u64, 32], data.clone()).to_bytes()).unwrap();
    let shared = g.shared_bytes("big").unwrap();
    assert_eq!(shared.as_slice(), &data[..]);
    shared.release_part(10_000..30_000);
    assert_eq!(shared.as_slice(), &data[..]);
    shared.release();
    shared.release();
    assert_eq!(shared.as_slice(), &data[..]);
    assert_eq!(g.bytes("q").unwrap(), &[3u8; 34][..], "neighbours keep their bytes");
}

/// MXFP4 tensors (type 39, 17-byte blocks of 32) are read with their type, shape and bytes; a row that is not
/// whole blocks of 32 is refused.
#[test]
fn reads_mxfp4_tensors() {
    // `[2, 64]` elements: 4 blocks of 17 bytes.
    let mx: Vec<u8> = (0..4 * 17).map(|i| (i * 13) as u8).collect();
    let b = GgufWriter::new().tensor("mx", DType::MXFP4, &[64, 2], mx.clone()).to_bytes();
    // The type id as written: 39.
    let at = 24 + b[24..].windows(2).position(|x| x == b"mx").unwrap() + 2;
    let dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let t = at + 4 + 8 * dims;
    assert_eq!(u32::from_le_bytes(b[t..t + 4].try_into().unwrap()), 39);
    let g = open_bytes(&b).unwrap();
    let info = g.info("mx").unwrap();
    assert_eq!((info.dtype, info.shape.as_slice()), (DType::MXFP4, &[2u64, 64][..]));
    assert_eq!(g.bytes("mx").unwrap(), &mx[..]);
    let e = err_of(&GgufWriter::new().tensor("w", DType::MXFP4, &[48], vec![0; 26]).to_bytes());
    assert!(e.problem.contains("block size 32"), "{e}");
}
