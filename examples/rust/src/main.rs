//! A Rust consumer of libdsa_kernels with its own `extern "C"` declarations: plans a prefill,
//! runs c128 prefill and decode and a metadata copy through the host backend on built-in data,
//! checks every result against values computed here and prints a one-line verdict.
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::ptr::{null, null_mut};

const ABI_VERSION: i32 = 11;
const DEVICE_HOST: i32 = -1;
const CHUNK: usize = 128;
const STATUS_OK: i32 = 0;
const STATUS_ABI_MISMATCH: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Segment {
    ragged_id: u32,
    batch_id: u32,
    position: u32,
    window_len: u32,
}

#[repr(C)]
struct PlanParams {
    struct_size: u32,
    graph_mode: u32,
    batch_size: i64,
    num_tokens: i64,
    seq_lens: *const i64,
    extend_lens: *const i64,
    compress: *mut Segment,
    write: *mut Segment,
    compress_capacity: i64,
    write_capacity: i64,
    num_compress: *mut i64,
    num_write: *mut i64,
}

#[repr(C)]
struct DecodeParams {
    struct_size: u32,
    flags: u32,
    device: i32,
    head_dim: i32,
    num_slots: i64,
    batch_size: i64,
    state: *mut f32,
    kv_score: *const f32,
    out: *mut f32,
    ape: *const f32,
    indices: *const i32,
    seq_lens: *const i32,
    error_count: *mut u32,
    state_dtype: i32,
    reserved: i32,
    load_indices: *const i32,
    store: *const c_void,
    cache_slots: *const i64,
}

#[repr(C)]
struct PrefillParams {
    struct_size: u32,
    flags: u32,
    device: i32,
    head_dim: i32,
    num_slots: i64,
    batch_size: i64,
    num_tokens: i64,
    state: *mut f32,
    kv_score: *const f32,
    out: *mut f32,
    ape: *const f32,
    indices: *const i32,
    load_indices: *const i32,
    compress: *const Segment,
    write: *const Segment,
    compress_capacity: i64,
    write_capacity: i64,
    counts: *const i64,
    error_count: *mut u32,
    state_dtype: i32,
    out_layout: i32,
    store: *const c_void,
    cache_slots: *const i64,
}

#[repr(C)]
#[derive(Default)]
struct MetadataSources {
    fields: [usize; 9], // cache_seqlens, cu_seqlens_k, page_indices, seqlens_expanded, dsa_cache_seqlens,
                        // dsa_cu_seqlens_k, real_page_table, num_splits, flashmla_metadata
}

#[repr(C)]
#[derive(Default)]
struct MetadataDestination {
    cache_seqlens: usize, cache_seqlens_len: i64,
    cu_seqlens_k: usize, cu_seqlens_k_len: i64,
    page_table: usize, page_table_rows: i64, page_table_cols: i64, page_table_stride: i64,
    seqlens_expanded: usize, seqlens_expanded_len: i64,
    dsa_cache_seqlens: usize, dsa_cache_seqlens_len: i64,
    dsa_cu_seqlens_k: usize, dsa_cu_seqlens_k_len: i64,
    real_page_table: usize, real_page_table_rows: i64, real_page_table_cols: i64, real_page_table_stride: i64,
    num_splits: usize, num_splits_len: i64,
    flashmla_metadata: usize, flashmla_metadata_len: i64,
}

#[repr(C)]
struct MetadataCopyParams {
    struct_size: u32,
    flags: u32,
    device: i32,
    mode: i32,
    bs: i64,
    page_rows: i64,
    page_width: i64,
    expanded: i64,
    real_cols: i64,
    metadata_size: i64,
    src: MetadataSources,
    num_destinations: i32,
    reserved: i32,
    destinations: *const MetadataDestination,
}

extern "C" {
    fn dsa_abi_version() -> i32;
    fn dsa_last_error() -> *const c_char;
    fn dsa_struct_size(id: i32) -> usize;
    fn dsa_c128_plan_prefill(p: *const PlanParams) -> i32;
    fn dsa_c128_decode(p: *const DecodeParams, stream: *mut c_void) -> i32;
    fn dsa_c128_prefill(p: *const PrefillParams, stream: *mut c_void) -> i32;
    fn dsa_metadata_copy(p: *const MetadataCopyParams, stream: *mut c_void) -> i32;
}

struct Checks(u32);

impl Checks {
    fn expect(&mut self, ok: bool, what: &str) {
        if !ok {
            let why = unsafe { CStr::from_ptr(dsa_last_error()) }.to_string_lossy();
            eprintln!("check failed: {what} ({why})");
            self.0 += 1;
        }
    }
}

fn lcg_floats(n: usize, seed: &mut u32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            ((*seed >> 8) & 0xFFFF) as f32 / 16384.0 - 2.0
        })
        .collect()
}

fn chunk_reference(rows: &[f32], ape: &[f32], d: usize, chunk: usize) -> Vec<f64> {
    (0..d)
        .map(|c| {
            let t: Vec<f64> = (0..CHUNK).map(|j| rows[(chunk * CHUNK + j) * 2 * d + d + c] as f64 + ape[j * d + c] as f64).collect();
            let m = t.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let (mut s, mut acc) = (0.0, 0.0);
            for j in 0..CHUNK {
                let w = (t[j] - m).exp();
                s += w;
                acc += w * rows[(chunk * CHUNK + j) * 2 * d + c] as f64;
            }
            acc / s
        })
        .collect()
}

fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

fn plan(seq: &[i64], ext: &[i64], checks: &mut Checks) -> (Vec<Segment>, Vec<Segment>) {
    let mut compress = vec![Segment::default(); 16];
    let mut write = vec![Segment::default(); 16];
    let (mut nc, mut nw) = (0i64, 0i64);
    let p = PlanParams {
        struct_size: std::mem::size_of::<PlanParams>() as u32,
        graph_mode: 0,
        batch_size: seq.len() as i64,
        num_tokens: ext.iter().sum(),
        seq_lens: seq.as_ptr(),
        extend_lens: ext.as_ptr(),
        compress: compress.as_mut_ptr(),
        write: write.as_mut_ptr(),
        compress_capacity: 16,
        write_capacity: 16,
        num_compress: &mut nc,
        num_write: &mut nw,
    };
    checks.expect(unsafe { dsa_c128_plan_prefill(&p) } == STATUS_OK, "plan");
    compress.truncate(nc as usize);
    write.truncate(nw as usize);
    // The records, cut here position by position.
    let (mut want_c, mut want_w, mut ragged) = (vec![], vec![], 0i64);
    for b in 0..seq.len() {
        let prefix = seq[b] - ext[b];
        let mut start = prefix;
        for pos in prefix..seq[b] {
            let closes = pos % CHUNK as i64 == CHUNK as i64 - 1;
            if closes || pos == seq[b] - 1 {
                let s = Segment { ragged_id: (ragged + pos - prefix) as u32, batch_id: b as u32, position: pos as u32, window_len: (pos - start + 1) as u32 };
                if closes { want_c.push(s) } else { want_w.push(s) }
                start = pos + 1;
            }
        }
        ragged += ext[b];
    }
    checks.expect(compress == want_c && write == want_w, "plan records");
    (compress, write)
}

fn main() {
    let mut checks = Checks(0);
    if unsafe { dsa_abi_version() } != ABI_VERSION {
        println!("dsa_kernels Rust consumer: FAIL (library ABI differs from {ABI_VERSION})");
        std::process::exit(1);
    }
    let sizes = [(1, std::mem::size_of::<PlanParams>()), (2, std::mem::size_of::<DecodeParams>()),
                 (3, std::mem::size_of::<PrefillParams>()), (5, std::mem::size_of::<MetadataDestination>()),
                 (6, std::mem::size_of::<MetadataCopyParams>())];
    for (id, size) in sizes {
        checks.expect(unsafe { dsa_struct_size(id) } == size, "struct layout matches the library");
    }
    plan(&[300, 50], &[200, 50], &mut checks);

    // Prefill 300 tokens from position 0 into slot 1, then decode to the end of chunk 2.
    let d = 64usize;
    let mut seed = 7u32;
    let rows = lcg_floats(3 * CHUNK * 2 * d, &mut seed);
    let ape = lcg_floats(CHUNK * d, &mut seed);
    let mut state = vec![1e30f32; 2 * 3 * d];
    let mut out = vec![f32::NAN; 300 * d];
    let (compress, write) = plan(&[300], &[300], &mut checks);
    let slot = [1i32];
    let p = PrefillParams {
        struct_size: std::mem::size_of::<PrefillParams>() as u32, flags: 0, device: DEVICE_HOST, head_dim: d as i32,
        num_slots: 2, batch_size: 1, num_tokens: 300, state: state.as_mut_ptr(), kv_score: rows.as_ptr(),
        out: out.as_mut_ptr(), ape: ape.as_ptr(), indices: slot.as_ptr(), load_indices: null(),
        compress: compress.as_ptr(), write: write.as_ptr(), compress_capacity: compress.len() as i64,
        write_capacity: write.len() as i64, counts: null(), error_count: null_mut(), state_dtype: 0, out_layout: 0,
        store: null(), cache_slots: null(),
    };
    checks.expect(unsafe { dsa_c128_prefill(&p, null_mut()) } == STATUS_OK, "prefill");
    for chunk in 0..2 {
        let row = (chunk * CHUNK + CHUNK - 1) * d;
        checks.expect(relative_error(&out[row..row + d], &chunk_reference(&rows, &ape, d, chunk)) < 1e-5, "prefill chunk vector");
    }
    let mut decoded = vec![f32::NAN; d];
    for pos in 300..3 * CHUNK {
        let seq_len = [pos as i32 + 1];
        let q = DecodeParams {
            struct_size: std::mem::size_of::<DecodeParams>() as u32, flags: 0, device: DEVICE_HOST, head_dim: d as i32,
            num_slots: 2, batch_size: 1, state: state.as_mut_ptr(), kv_score: rows[pos * 2 * d..].as_ptr(),
            out: decoded.as_mut_ptr(), ape: ape.as_ptr(), indices: slot.as_ptr(), seq_lens: seq_len.as_ptr(),
            error_count: null_mut(), state_dtype: 0, reserved: 0, load_indices: null(),
            store: null(), cache_slots: null(),
        };
        checks.expect(unsafe { dsa_c128_decode(&q, null_mut()) } == STATUS_OK, "decode");
    }
    checks.expect(relative_error(&decoded, &chunk_reference(&rows, &ape, d, 2)) < 1e-5, "decode chunk vector");
    checks.expect(state[..3 * d].iter().all(|&x| x == 1e30), "slot 0 untouched");
    let bad = PlanParams { struct_size: 8, graph_mode: 0, batch_size: 0, num_tokens: 0, seq_lens: null(), extend_lens: null(),
                           compress: null_mut(), write: null_mut(), compress_capacity: 0, write_capacity: 0,
                           num_compress: null_mut(), num_write: null_mut() };
    checks.expect(unsafe { dsa_c128_plan_prefill(&bad) } == STATUS_ABI_MISMATCH, "a wrong struct_size is refused");

    // Metadata copy: 3 requests, page rows of 5 into a table of stride 8.
    let (bs, width, stride) = (3usize, 5usize, 8usize);
    let cache: Vec<i32> = (0..bs as i32).map(|i| 10 + i).collect();
    let cu: Vec<i32> = (0..=bs as i32).map(|i| 100 * i).collect();
    let pages: Vec<i32> = (0..(bs * width) as i32).map(|i| 1000 + i).collect();
    let (mut d_cache, mut d_cu, mut d_pages) = (vec![-1i32; bs], vec![-1i32; bs + 1], vec![-1i32; bs * stride]);
    let (mut d_dcache, mut d_dcu) = (vec![-1i32; bs], vec![-1i32; bs + 1]);
    let dst = MetadataDestination {
        cache_seqlens: d_cache.as_mut_ptr() as usize, cache_seqlens_len: bs as i64,
        cu_seqlens_k: d_cu.as_mut_ptr() as usize, cu_seqlens_k_len: bs as i64 + 1,
        page_table: d_pages.as_mut_ptr() as usize, page_table_rows: bs as i64, page_table_cols: stride as i64,
        page_table_stride: stride as i64,
        dsa_cache_seqlens: d_dcache.as_mut_ptr() as usize, dsa_cache_seqlens_len: bs as i64,
        dsa_cu_seqlens_k: d_dcu.as_mut_ptr() as usize, dsa_cu_seqlens_k_len: bs as i64 + 1,
        ..Default::default()
    };
    let mut src = MetadataSources::default();
    src.fields[0] = cache.as_ptr() as usize;
    src.fields[1] = cu.as_ptr() as usize;
    src.fields[2] = pages.as_ptr() as usize;
    src.fields[4] = cache.as_ptr() as usize;
    src.fields[5] = cu.as_ptr() as usize;
    let m = MetadataCopyParams {
        struct_size: std::mem::size_of::<MetadataCopyParams>() as u32, flags: 0, device: DEVICE_HOST, mode: 0,
        bs: bs as i64, page_rows: bs as i64, page_width: width as i64, expanded: 0, real_cols: 0, metadata_size: 0,
        src, num_destinations: 1, reserved: 0, destinations: &dst,
    };
    checks.expect(unsafe { dsa_metadata_copy(&m, null_mut()) } == STATUS_OK, "metadata copy");
    let mut ok = d_cache == cache && d_dcache == cache && d_cu[0] == -1 && d_cu[1..] == cu[1..] && d_dcu[1..] == cu[1..];
    for r in 0..bs {
        for c in 0..stride {
            ok &= d_pages[r * stride + c] == if c < width { pages[r * width + c] } else { -1 };
        }
    }
    checks.expect(ok, "metadata copy contents");
    let verdict = if checks.0 == 0 { "OK" } else { "FAIL" };
    println!("dsa_kernels Rust consumer: {verdict} ({} failed checks, host backend)", checks.0);
    std::process::exit(if checks.0 == 0 { 0 } else { 1 });
}
