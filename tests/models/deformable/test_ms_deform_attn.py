"""Multi-scale deformable attention: the functional core against a direct bilinear
reference and against per-level grid_sample (the official algorithm, kept in
:mod:`detr_peg.models.deformable.ms_deform_attn_official`), and the
MSDeformAttn module's official contract (layouts, init, masks, reference boxes)."""

from __future__ import annotations

import math

import pytest
import torch

from detr_peg.models.deformable import ms_deform_attn_function as msda_function
from detr_peg.models.deformable.ms_deform_attn import MSDeformAttn
from detr_peg.models.deformable.ms_deform_attn_function import (
    IMPLEMENTATIONS,
    LEVEL_SIZE_IMPLEMENTATIONS,
    ms_deform_attn,
)
from detr_peg.models.deformable.ms_deform_attn_official import ms_deform_attn_core_pytorch

SHAPES = [(7, 5), (4, 3), (1, 1), (2, 9)]  # (H, W) per level: odd sizes and a single pixel
B, LQ, M, D, P = 2, 5, 3, 4, 3


def level_start(shapes: torch.Tensor) -> torch.Tensor:
    areas = shapes[:, 0] * shapes[:, 1]
    return torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])


def reference_ms_deform_attn(value, shapes, sampling_locations, attention_weights):
    """Direct bilinear sampling, align_corners=False, zero padding; no grid_sample.

    Pixel (i, j) of level l has its center at ((j + 0.5) / W, (i + 0.5) / H).
    A location maps to the pixel coordinate x = loc_x * W - 0.5 (y likewise);
    the four pixels around it, floor(x) and floor(x) + 1, get the weights
    1 - frac and frac, and pixels outside the level contribute zero.
    """
    b, s, m, d = value.shape
    _, lq, _, n_levels, n_points, _ = sampling_locations.shape
    out = value.new_zeros(b, lq, m, d)
    bi = torch.arange(b)[:, None, None, None]
    mi = torch.arange(m)[None, None, :, None]
    start = 0
    for level, (h, w) in enumerate(shapes):
        x = sampling_locations[:, :, :, level, :, 0] * w - 0.5  # [B, Lq, M, P]
        y = sampling_locations[:, :, :, level, :, 1] * h - 0.5
        x0, y0 = x.detach().floor(), y.detach().floor()
        fx, fy = x - x0, y - y0
        for dy in (0, 1):
            for dx in (0, 1):
                cx, cy = x0 + dx, y0 + dy
                wx = fx if dx else 1 - fx
                wy = fy if dy else 1 - fy
                inside = (cx >= 0) & (cx < w) & (cy >= 0) & (cy < h)
                row = start + (cy.clamp(0, h - 1) * w + cx.clamp(0, w - 1)).long()
                corner = value[bi, row, mi]  # [B, Lq, M, P, D]
                weight = wx * wy * inside * attention_weights[:, :, :, level]
                out = out + (corner * weight[..., None]).sum(3)
        start += h * w
    return out.reshape(b, lq, m * d)


def make_inputs(dtype=torch.float64, seed=0, shapes=SHAPES, lq=LQ):
    g = torch.Generator().manual_seed(seed)
    shapes_t = torch.tensor(shapes, dtype=torch.int64)
    s = int((shapes_t[:, 0] * shapes_t[:, 1]).sum())
    n_levels = len(shapes)
    value = torch.randn(B, s, M, D, generator=g, dtype=dtype)
    loc = torch.rand(B, lq, M, n_levels, P, 2, generator=g, dtype=dtype) * 1.6 - 0.3  # some outside [0, 1]
    weights = torch.rand(B, lq, M, n_levels * P, generator=g, dtype=dtype).softmax(-1).view(B, lq, M, n_levels, P)
    if lq < 3:
        return value, shapes_t, level_start(shapes_t), loc, weights
    # Exactly on the borders, far outside, and on pixel centers that are exact in binary
    # (H = 4: y = (i + 0.5) / 4), where floor() must pick the cell to the right/below.
    loc[0, 0, :, :, 0] = 0.0
    loc[0, 1, :, :, 0] = 1.0
    loc[0, 2, :, :, 0, 0] = -2.5
    loc[0, 2, :, :, 1, 1] = 7.0
    loc[1, 0, :, :, 0, 0] = 1.0
    loc[1, 0, :, :, 0, 1] = 0.0
    loc[1, 1, :, 1, :, 1] = torch.tensor([0.125, 0.375, 0.875], dtype=dtype)
    return value, shapes_t, level_start(shapes_t), loc, weights


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_forward_and_gradients_match_direct_bilinear_reference(impl):
    value, shapes, start, loc, weights = make_inputs(torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    ref_inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    out = ms_deform_attn(inputs[0], shapes, start, inputs[1], inputs[2], impl=impl)
    expected = reference_ms_deform_attn(ref_inputs[0], SHAPES, ref_inputs[1], ref_inputs[2])
    assert out.shape == (B, LQ, M * D) and out.dtype == torch.float64
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, ref_inputs, grad)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_float32_matches_official_grid_sample_algorithm(impl):
    value, shapes, start, loc, weights = make_inputs(torch.float32, seed=1)
    # Pixel centers of odd-sized levels are not exact in binary: the implementation must
    # round the pixel coordinate like grid_sample does to pick the same cell (this decides
    # the location gradient there; Deformable-DETR's encoder samples such points at init).
    for level, (h, w) in enumerate(SHAPES):
        loc[1, 2, :, level, :, 0] = (torch.arange(P, dtype=torch.float32) % w + 0.5) / w
        loc[1, 2, :, level, :, 1] = (torch.arange(P, dtype=torch.float32) % h + 0.5) / h
    inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    ref_inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    out = ms_deform_attn(inputs[0], shapes, start, inputs[1], inputs[2], impl=impl)
    expected = ms_deform_attn_core_pytorch(ref_inputs[0], SHAPES, ref_inputs[1], ref_inputs[2])
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, ref_inputs, grad)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_gradcheck_tiny(impl):
    shapes = [(3, 2), (1, 4)]
    g = torch.Generator().manual_seed(3)
    shapes_t = torch.tensor(shapes)
    value = torch.randn(1, 10, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    loc = (torch.rand(1, 2, 2, 2, 2, 2, generator=g, dtype=torch.float64) * 1.4 - 0.2).requires_grad_(True)
    weights = torch.rand(1, 2, 2, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)

    def fn(v, l, w):
        return ms_deform_attn(v, shapes_t, level_start(shapes_t), l, w, impl=impl)

    assert torch.autograd.gradcheck(fn, (value, loc, weights))


def test_cpu_query_blocks_give_the_same_result(monkeypatch):
    # On CPU the embedding_bag path works through the queries in blocks of about
    # _CPU_CHUNK_SAMPLES samples; force many blocks, the last one partial.
    monkeypatch.setattr(msda_function, "_CPU_CHUNK_SAMPLES", 2 * (B * M * len(SHAPES) * P))  # 2 queries
    value, shapes, start, loc, weights = make_inputs(torch.float64, seed=6, lq=7)
    assert [c.stop - c.start for c in msda_function._query_chunks(loc)] == [2, 2, 2, 1]
    inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    ref_inputs = [t.clone().requires_grad_(True) for t in (value, loc, weights)]
    out = ms_deform_attn(inputs[0], shapes, start, inputs[1], inputs[2])
    expected = reference_ms_deform_attn(ref_inputs[0], SHAPES, ref_inputs[1], ref_inputs[2])
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(expected, ref_inputs, grad)):
        torch.testing.assert_close(got, want)


def test_reduced_precision_follows_the_float32_result():
    value, shapes, start, loc, weights = make_inputs(torch.float32, seed=7)
    expected = ms_deform_attn(value, shapes, start, loc, weights)
    for dtype in (torch.bfloat16, torch.float16):
        inputs = [t.to(dtype).requires_grad_(True) for t in (value, loc, weights)]
        out = ms_deform_attn(inputs[0], shapes, start, inputs[1], inputs[2])
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)
        grads = torch.autograd.grad(out.float().sum(), inputs)
        assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_implementations_agree_on_inputs_requiring_partial_gradients():
    value, shapes, start, loc, weights = make_inputs(torch.float64, seed=2)
    value.requires_grad_(True)  # locations and weights are constants here
    out = ms_deform_attn(value, shapes, start, loc, weights)
    (grad_value,) = torch.autograd.grad(out.square().sum(), value)
    expected = reference_ms_deform_attn(value, SHAPES, loc, weights)
    torch.testing.assert_close(grad_value, torch.autograd.grad(expected.square().sum(), value)[0])


def test_dtype_promotion_and_list_shapes():
    value, shapes, start, loc, weights = make_inputs(torch.float64, seed=4)
    out = ms_deform_attn(value.float(), SHAPES, start, loc, weights)  # float32 values, float64 locations
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference_ms_deform_attn(value.float().double(), SHAPES, loc, weights))
    out_gs = ms_deform_attn(value, SHAPES, start, loc, weights, impl="grid_sample")
    torch.testing.assert_close(out_gs, reference_ms_deform_attn(value, SHAPES, loc, weights))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_no_queries(impl):
    value, shapes, start, loc, weights = make_inputs(torch.float32, lq=0)
    out = ms_deform_attn(value, shapes, start, loc, weights, impl=impl)
    assert out.shape == (B, 0, M * D)


def test_bad_arguments_raise():
    value, shapes, start, loc, weights = make_inputs(torch.float32)
    with pytest.raises(ValueError, match="valid are embedding_bag, grid_sample, grid_sample_sum, gather"):
        ms_deform_attn(value, shapes, start, loc, weights, impl="cuda")
    with pytest.raises(ValueError, match="attention_weights"):
        ms_deform_attn(value, shapes, start, loc, weights[..., :1])
    with pytest.raises(ValueError, match="levels"):
        ms_deform_attn(value, shapes[:3], start[:3], loc, weights)


# ----------------------------------------------------------------------------------------------
# MSDeformAttn
# ----------------------------------------------------------------------------------------------

D_MODEL, HEADS, LEVELS, POINTS = 12, 3, len(SHAPES), 2


def module_inputs(seed=0, ref_dim=2):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(SHAPES)
    s = int((shapes[:, 0] * shapes[:, 1]).sum())
    query = torch.randn(B, LQ, D_MODEL, generator=g)
    ref = torch.rand(B, LQ, LEVELS, ref_dim, generator=g)
    if ref_dim == 4:
        ref[..., 2:] = ref[..., 2:] * 0.5 + 0.05
    flat = torch.randn(B, s, D_MODEL, generator=g)
    return query, ref, flat, shapes, level_start(shapes)


def randomized_module(seed=0, **kwargs):
    torch.manual_seed(seed)
    module = MSDeformAttn(d_model=D_MODEL, n_levels=LEVELS, n_heads=HEADS, n_points=POINTS, **kwargs)
    with torch.no_grad():  # the official init zeroes the query projections; make them matter
        module.sampling_offsets.weight.normal_(0.0, 0.3)
        module.attention_weights.weight.normal_(0.0, 0.3)
    return module.double()


def test_parameter_names_and_shapes_follow_official_layout():
    module = MSDeformAttn(d_model=256, n_levels=4, n_heads=8, n_points=4)
    shapes = {name: tuple(p.shape) for name, p in module.state_dict().items()}
    assert shapes == {
        "sampling_offsets.weight": (8 * 4 * 4 * 2, 256),
        "sampling_offsets.bias": (8 * 4 * 4 * 2,),
        "attention_weights.weight": (8 * 4 * 4, 256),
        "attention_weights.bias": (8 * 4 * 4,),
        "value_proj.weight": (256, 256),
        "value_proj.bias": (256,),
        "output_proj.weight": (256, 256),
        "output_proj.bias": (256,),
    }
    assert all(
        isinstance(getattr(module, n), torch.nn.Linear)
        for n in ("sampling_offsets", "attention_weights", "value_proj", "output_proj")
    )


@pytest.mark.parametrize("heads,levels,points", [(8, 4, 4), (3, 2, 5)])
def test_init_matches_official_grid(heads, levels, points):
    module = MSDeformAttn(d_model=heads * 4, n_levels=levels, n_heads=heads, n_points=points)
    expected = torch.empty(heads, levels, points, 2)
    for h in range(heads):
        theta = 2.0 * math.pi * h / heads
        direction = torch.tensor([math.cos(theta), math.sin(theta)])
        direction = direction / direction.abs().max()
        for i in range(points):
            expected[h, :, i] = direction * (i + 1)
    torch.testing.assert_close(module.sampling_offsets.bias.detach(), expected.flatten())
    assert (module.sampling_offsets.weight == 0).all()
    assert (module.attention_weights.weight == 0).all() and (module.attention_weights.bias == 0).all()
    assert (module.value_proj.bias == 0).all() and (module.output_proj.bias == 0).all()
    bound = math.sqrt(6.0 / (2 * heads * 4))  # xavier_uniform on a square matrix
    assert module.value_proj.weight.abs().max() <= bound and module.value_proj.weight.std() > bound / 4


@pytest.mark.parametrize("ref_dim", [2, 4])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_module_forward_follows_official_contract(ref_dim, impl):
    module = randomized_module(impl=impl)
    query, ref, flat, shapes, start = (
        t.double() if t.is_floating_point() else t for t in module_inputs(ref_dim=ref_dim)
    )
    mask = torch.zeros(B, flat.shape[1], dtype=torch.bool)
    mask[1, -7:] = True
    out = module(query, ref, flat, shapes, start, mask)
    assert out.shape == (B, LQ, D_MODEL)

    # The same computation written out: masked value, offsets scaled per level, softmax over L*P.
    value = module.value_proj(flat).masked_fill(mask[..., None], 0.0).view(B, -1, HEADS, D_MODEL // HEADS)
    offsets = module.sampling_offsets(query).view(B, LQ, HEADS, LEVELS, POINTS, 2)
    weights = module.attention_weights(query).view(B, LQ, HEADS, LEVELS * POINTS).softmax(-1)
    if ref_dim == 2:
        wh = torch.tensor([[w, h] for h, w in SHAPES], dtype=torch.float64)
        loc = ref[:, :, None, :, None, :] + offsets / wh[:, None, :]
    else:
        loc = ref[:, :, None, :, None, :2] + offsets / POINTS * ref[:, :, None, :, None, 2:] * 0.5
    sampled = reference_ms_deform_attn(value, SHAPES, loc, weights.view(B, LQ, HEADS, LEVELS, POINTS))
    torch.testing.assert_close(out, module.output_proj(sampled))


def test_point_locations_are_the_official_broadcast_to_the_bit(monkeypatch):
    """The column-wise ``ref + offset / (W, H)`` gives the official formula's values and gradients exactly."""
    import detr_peg.models.deformable.ms_deform_attn as module_file

    captured = []

    def capture(value, shapes, start, locations, weights, *, impl):
        captured.append(locations)
        return ms_deform_attn(value, shapes, start, locations, weights, impl=impl)

    monkeypatch.setattr(module_file, "ms_deform_attn", capture)
    module = randomized_module(seed=3).float()
    query, ref, flat, shapes, start = module_inputs(seed=3)
    query = query * 3  # offsets of several pixels
    ref.requires_grad_(True)
    module(query, ref, flat, shapes, start)
    (locations,) = captured

    ref_official = ref.detach().clone().requires_grad_(True)
    offsets = module.sampling_offsets(query).view(B, LQ, HEADS, LEVELS, POINTS, 2)
    normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1)
    expected = ref_official[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
    torch.testing.assert_close(locations, expected, rtol=0, atol=0)
    upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(4))
    (grad,) = torch.autograd.grad(locations, ref, upstream)
    (grad_official,) = torch.autograd.grad(expected, ref_official, upstream)
    torch.testing.assert_close(grad, grad_official, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_level_sizes_as_integers_reach_the_per_level_implementations(monkeypatch, impl):
    """``input_shapes`` (what keeps an exported graph's size dynamic) replaces the tensor for the
    per-level implementations only, and changes no result."""
    import detr_peg.models.deformable.ms_deform_attn as module_file

    received = []

    def capture(value, shapes, start, locations, weights, *, impl):
        received.append(shapes)
        return ms_deform_attn(value, shapes, start, locations, weights, impl=impl)

    monkeypatch.setattr(module_file, "ms_deform_attn", capture)
    module = randomized_module(seed=2, impl=impl).float()
    query, ref, flat, shapes, start = module_inputs(seed=2)
    out = module(query, ref, flat, shapes, start, input_shapes=SHAPES)
    without = module(query, ref, flat, shapes, start)
    assert received[0] is (SHAPES if impl in LEVEL_SIZE_IMPLEMENTATIONS else shapes)
    assert received[1] is shapes
    if impl in LEVEL_SIZE_IMPLEMENTATIONS:  # the other implementations ran the same call twice
        torch.testing.assert_close(out, without, rtol=0, atol=0)


def test_level_sizes_that_differ_from_the_shapes_tensor_are_refused():
    module = randomized_module(seed=2).float()
    query, ref, flat, shapes, start = module_inputs(seed=2)
    transposed = [(w, h) for h, w in SHAPES]  # the same token count, the wrong sizes
    assert transposed != [tuple(hw) for hw in SHAPES]
    with pytest.raises(ValueError, match=r"input_shapes .* differ from input_spatial_shapes"):
        module(query, ref, flat, shapes, start, input_shapes=transposed)


def test_padded_tokens_have_no_influence():
    module = randomized_module()
    query, ref, flat, shapes, start = (t.double() if t.is_floating_point() else t for t in module_inputs())
    ref = ref * 1.4 - 0.2  # sample around the padding too
    mask = torch.zeros(B, flat.shape[1], dtype=torch.bool)
    mask[0, 30:35] = True  # inside level 0 and the start of level 1
    mask[1, -9:] = True  # the whole last level
    out = module(query, ref, flat, shapes, start, mask)
    changed = flat.clone()
    changed[mask] = torch.randn(int(mask.sum()), D_MODEL, dtype=torch.float64) * 100
    torch.testing.assert_close(module(query, ref, changed, shapes, start, mask), out, rtol=0, atol=0)
    # ... and they do matter without the mask
    assert not torch.allclose(module(query, ref, changed, shapes, start, None), module(query, ref, flat, shapes, start))


def test_module_implementations_agree_in_float32():
    query, ref, flat, shapes, start = module_inputs(seed=5)
    modules = [randomized_module(seed=1, impl=impl).float() for impl in IMPLEMENTATIONS]
    outs = []
    for module in modules:
        out = module(query, ref, flat, shapes, start)
        out.square().sum().backward()
        outs.append((out, [p.grad for p in module.parameters()]))
    (out0, grads0), *others = outs
    for out1, grads1 in others:
        torch.testing.assert_close(out0, out1)
        for g0, g1 in zip(grads0, grads1):
            torch.testing.assert_close(g0, g1, rtol=1e-4, atol=1e-5)


def test_module_bad_arguments_raise():
    with pytest.raises(ValueError, match="divisible"):
        MSDeformAttn(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="valid are"):
        MSDeformAttn(impl="cuda")
    module = MSDeformAttn(d_model=D_MODEL, n_levels=LEVELS, n_heads=HEADS, n_points=POINTS)
    query, ref, flat, shapes, start = module_inputs()
    with pytest.raises(ValueError, match="must end in 2"):
        module(query, torch.rand(B, LQ, LEVELS, 3), flat, shapes, start)
    with pytest.raises(ValueError, match="add up to"):
        module(query, ref, flat[:, :-1], shapes, start)
