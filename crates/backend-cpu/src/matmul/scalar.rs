//! The scalar kernels: the tile shapes of the fast paths, computed lane by lane with the reference's own
//! functions (`dot16`, `CheckpointBlock::update`), so they are the reference by construction.

use tf_core::DType;
use tf_quant::reference::matmul::{dot16, ActBlock, CheckpointBlock};
use tf_quant::{
    cast_blocks, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockIQ4NL, BlockIQ4XS,
    BlockMXFP4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1,
};

use super::act::ActQ;
use super::QuantKernel;

/// `dot16` of weight rows `w[0..c]` with activation rows `x[0..rt]` (`c · rt = 4`): lane `ci · rt + ri`.
pub(super) fn dot16_tile(c: usize, rt: usize, w: &[&[f32]; 4], x: &[&[f32]; 4]) -> [f32; 4] {
    let mut out = [0f32; 4];
    for ci in 0..c {
        for ri in 0..rt {
            out[ci * rt + ri] = dot16(x[ri], w[ci]);
        }
    }
    out
}

/// The scalar checkpoint kernel of `dtype` (a type with `checkpoint_block`).
pub(super) fn quant_kernel(dtype: DType) -> QuantKernel {
    match dtype {
        DType::Q4_0 => tile::<BlockQ4_0>,
        DType::Q4_1 => tile::<BlockQ4_1>,
        DType::Q5_0 => tile::<BlockQ5_0>,
        DType::Q5_1 => tile::<BlockQ5_1>,
        DType::Q8_0 => tile::<BlockQ8_0>,
        DType::Q8_1 => tile::<BlockQ8_1>,
        DType::Q2K => tile::<BlockQ2K>,
        DType::Q3K => tile::<BlockQ3K>,
        DType::Q4K => tile::<BlockQ4K>,
        DType::Q5K => tile::<BlockQ5K>,
        DType::Q6K => tile::<BlockQ6K>,
        DType::Q8K => tile::<BlockQ8K>,
        DType::IQ4NL => tile::<BlockIQ4NL>,
        DType::IQ4XS => tile::<BlockIQ4XS>,
        DType::IQ3S => tile::<BlockIQ3S>,
        DType::IQ3XXS => tile::<BlockIQ3XXS>,
        DType::MXFP4 => tile::<BlockMXFP4>,
        DType::IQ2XXS => tile::<BlockIQ2XXS>,
        DType::IQ2XS => tile::<BlockIQ2XS>,
        DType::IQ1S => tile::<BlockIQ1S>,
        DType::IQ2S => tile::<BlockIQ2S>,
        _ => unreachable!("{dtype} has no checkpoint kernel"),
    }
}

/// Weight rows `cols[0..8 / rt]` × activation rows `r0..r0 + rt`: each lane's blocks folded in order.
fn tile<B: CheckpointBlock>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    let mut out = [0f32; 8];
    for ci in 0..8 / rt {
        let blocks = cast_blocks::<B>(cols[ci]).expect("whole blocks");
        for ri in 0..rt {
            let r = r0 + ri;
            out[ci * rt + ri] = blocks.iter().enumerate().fold(0f32, |acc, (b, blk)| {
                let a = ActBlock { qs: act.block_qs(r, b), d: act.d[r * act.nb + b], sums: act.block_sums(r, b) };
                blk.update(&a, acc)
            });
        }
    }
    out
}
