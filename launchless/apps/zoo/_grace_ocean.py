"""GraCE's ocean workloads: float64 stand-ins of the same shape for TorchBench's pyhpc models (from the Veros ocean
model) -- the seawater equation of state, the turbulent kinetic energy step and the isoneutral mixing coefficients --
as model code of our own, on pyhpc's default grid. What makes each one a graph workload is kept: hundreds of small
elementwise kernels, constants made on the device at every call, and results written into the tensors a call passes
in."""

from __future__ import annotations

import torch
from torch import nn

from ._common import Inputs
from ._transformers import Built

OCEAN_GRID = (204, 204, 26)  # TorchBench's pyhpc models at their default size (2**20 points): x, y, depth levels


class OceanEquationOfState(nn.Module):
    """A stand-in of the same shape as the seawater equation of state TorchBench's pyhpc_equation_of_state
    evaluates: one float64 polynomial in the square root of salinity, temperature and pressure, term by term --
    about 300 elementwise operations over the ocean grid in eager, one fused kernel once compiled. The
    coefficients are fixed pseudo-random numbers (the timings and the graphs do not depend on them)."""

    SALINITY_POWERS, TEMPERATURE_POWERS, PRESSURE_POWERS = 4, 6, 3

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0xE05)
        shape = (self.SALINITY_POWERS, self.TEMPERATURE_POWERS, self.PRESSURE_POWERS)
        self.coefficients = torch.randn(shape, generator=generator, dtype=torch.float64).tolist()  # Python floats

    def forward(self, salinity: torch.Tensor, temperature: torch.Tensor, pressure: torch.Tensor) -> torch.Tensor:
        x = torch.sqrt(salinity * 0.0248826675584615 + 0.5)
        y = temperature * 0.025
        z = pressure * 1e-4
        xs, ys, zs = (
            _powers(x, self.SALINITY_POWERS),
            _powers(y, self.TEMPERATURE_POWERS),
            _powers(z, self.PRESSURE_POWERS),
        )
        density = torch.zeros_like(x)
        for i, by_temperature in enumerate(self.coefficients):
            for j, by_pressure in enumerate(by_temperature):
                for k, coefficient in enumerate(by_pressure):
                    density = density + coefficient * xs[i] * ys[j] * zs[k]
        return density


def _powers(x: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``[1, x, x**2, ...]``, ``count`` of them, each from the last (as a hand-written polynomial computes them)."""
    powers = [torch.ones_like(x), x]
    while len(powers) < count:
        powers.append(powers[-1] * x)
    return powers[:count]


def ocean_equation_of_state(batch: int) -> Built:
    """The stand-in on the pyhpc grid: salinity and temperature per point, pressure per depth level (``batch`` grids
    stacked along x; pyhpc computes in float64: the bench workload builds it so)."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        salinity = 30.0 + 10.0 * torch.rand(batch * nx, ny, nz)
        temperature = 25.0 * torch.rand(batch * nx, ny, nz)
        pressure = torch.linspace(0.0, 5000.0, nz).reshape(1, 1, nz)
        return (salinity, temperature, pressure), {}

    return OceanEquationOfState(), make


class OceanTurbulence(nn.Module):
    """A stand-in of the same shape as the turbulent kinetic energy step TorchBench's pyhpc_turbulent_kinetic_energy
    integrates (from the Veros ocean model), as model code of our own: on a float64 ocean grid, an implicit vertical
    diffusion solved level by level (the Thomas algorithm, a Python loop over the depth levels writing slices in
    place), then flux-limited (superbee) advection along the three axes, its limiter's bounds made as small tensors
    on the device at every call as the original makes them -- hundreds of small kernels and host-made constants."""

    def __init__(self, dt: float = 1.0) -> None:
        super().__init__()
        self.dt = dt

    def forward(
        self,
        velocity: torch.Tensor,  # [3, nx, ny, nz]: u, v, w
        energy: torch.Tensor,  # [nx, ny, nz]
        diffusivity: torch.Tensor,  # [nx, ny, nz]
        forcing: torch.Tensor,  # [nx, ny, nz]
        water: torch.Tensor,  # [nx, ny, nz]: 1 in water, 0 on land
        thickness: torch.Tensor,  # [nz]: each level's thickness
    ) -> torch.Tensor:
        above = -self.dt * diffusivity / (thickness * thickness)
        below = torch.roll(above, 1, dims=2)
        diagonal = 1.0 - above - below
        solved = _thomas(below * water, diagonal, above * water, (energy + self.dt * forcing) * water)
        tendency = torch.zeros_like(solved)
        for axis in range(3):
            flux = _superbee_flux(velocity[axis], solved, water, axis, self.dt)
            tendency = tendency - (flux - torch.roll(flux, 1, dims=axis))
        return (solved + self.dt * tendency) * water


def _thomas(lower: torch.Tensor, diagonal: torch.Tensor, upper: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The tridiagonal systems along the last axis, solved by elimination and back substitution, level by level."""
    diagonal, right = diagonal.clone(), right.clone()
    levels = diagonal.shape[-1]
    for k in range(1, levels):
        factor = lower[..., k] / diagonal[..., k - 1]
        diagonal[..., k] -= factor * upper[..., k - 1]
        right[..., k] -= factor * right[..., k - 1]
    out = torch.empty_like(right)
    out[..., -1] = right[..., -1] / diagonal[..., -1]
    for k in range(levels - 2, -1, -1):
        out[..., k] = (right[..., k] - upper[..., k] * out[..., k + 1]) / diagonal[..., k]
    return out


def _superbee_flux(
    velocity: torch.Tensor, field: torch.Tensor, water: torch.Tensor, axis: int, dt: float
) -> torch.Tensor:
    """The superbee-limited upwind flux of ``field`` through each cell's face along ``axis``."""
    ahead, behind = torch.roll(field, -1, dims=axis), torch.roll(field, 1, dims=axis)
    jump_ahead, jump, jump_behind = (
        (ahead - field) * water,
        (field - behind) * water,
        (behind - torch.roll(behind, 1, dims=axis)) * water,
    )
    upwind = torch.where(velocity > 0.0, jump_behind, jump_ahead)
    ratio = upwind / torch.where(torch.abs(jump) < 1e-20, 1e-20, jump)
    zero, one, two = (torch.tensor([value], dtype=field.dtype, device=field.device) for value in (0.0, 1.0, 2.0))
    limited = torch.maximum(zero, torch.maximum(torch.minimum(one, 2 * ratio), torch.minimum(two, ratio)))
    courant = torch.abs(velocity * dt)
    return velocity * (field + behind) * 0.5 - torch.abs(velocity) * ((1.0 - limited) + courant * limited) * jump * 0.5


def ocean_turbulence(batch: int) -> Built:
    """The stand-in on pyhpc's default grid (``batch`` grids stacked along x; float64 as pyhpc computes, set by the
    bench workload)."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        shape = (batch * nx, ny, nz)
        velocity = 0.1 * torch.randn(3, *shape)
        water = (torch.rand(shape) < 0.8).float()
        thickness = 1.0 + torch.rand(nz)
        return (velocity, torch.rand(shape), 0.1 * torch.rand(shape), torch.randn(shape), water, thickness), {}

    return OceanTurbulence(), make


class OceanIsoneutralMixing(nn.Module):
    """A stand-in of the same shape as the isoneutral mixing coefficients TorchBench's pyhpc_isoneutral_mixing
    computes (Griffies' isoneutral diffusion, from the Veros ocean model), as model code of our own: the slopes of
    the density surfaces at the east, north and top faces of every cell, tapered where they are steep, each from
    the two neighbouring cells of each of two levels (Python loops over those four), summed into the three
    diffusivities. What makes it a graph workload is kept: it writes its results **into the tensors it is given**
    (the diffusivities ``k`` and the slopes ``slopes``, as the original fills its K_11, K_22, K_33 and Ai_* inputs),
    its small constants are made on the device at every call, and a call takes about 260 MB of float64 inputs."""

    EPSILON = 1e-20
    STEEP = 50.0  # the diffusivity a steep slope still gets
    SLOPE_LIMIT, SLOPE_WIDTH = 1e-3, 1e-3  # where the taper falls off, and how fast

    def forward(
        self,
        masks: torch.Tensor,  # [4, nx, ny, nz]: cells, east faces, north faces, top faces (1 in water)
        widths_x: torch.Tensor,  # [2, nx]: cell and face widths
        widths_y: torch.Tensor,  # [2, ny]
        widths_z: torch.Tensor,  # [2, nz]
        cosines: torch.Tensor,  # [2, ny]: the cosine of the latitude at cells and faces
        salt: torch.Tensor,  # [nx, ny, nz, 3]: time levels
        temperature: torch.Tensor,  # [nx, ny, nz, 3]
        depth: torch.Tensor,  # [nz]
        k_iso: torch.Tensor,  # [nx, ny, nz]: the isoneutral diffusivity
        k: torch.Tensor,  # [3, nx, ny, nz]: written: the east, north and top diffusivities
        slopes: torch.Tensor,  # [4, nx, ny, nz, 2, 2]: written: the tapered slopes by neighbour and level
    ) -> tuple[torch.Tensor, torch.Tensor]:
        zero, steep = (torch.tensor([v], dtype=k.dtype, device=k.device) for v in (0.0, self.STEEP))
        mask_cells, mask_top = masks[0], masks[3]
        t, s = temperature[..., 0], salt[..., 0]
        density_by_t = mask_cells * -(1e-5 * (t - 9.85) + 1.67e-4 * (1 - 1.1e-8 * 9.81 * depth.abs() * 1024.0)) * 1024
        density_by_s = mask_cells * 0.78e-3 * 1024.0 * torch.ones_like(t)
        steps = (  # the distance between the centres of two neighbouring cells, along x, y and z
            widths_x[1][:-1, None, None] * cosines[0][None, :, None],
            widths_y[1][None, :-1, None],
            widths_z[1][None, None, :-1],
        )
        gradients = [  # of (temperature, salt) across the east, north and top faces
            tuple(_face_gradient(field, axis, masks[axis + 1], steps[axis]) for field in (t, s)) for axis in range(3)
        ]

        def slope(here: tuple, across: tuple, levels: slice, vertical: torch.Tensor) -> torch.Tensor:
            along = density_by_t[(*here, levels)] * across[0] + density_by_s[(*here, levels)] * across[1]
            return -along / (torch.minimum(vertical, zero) - self.EPSILON)

        levels = k.shape[3]
        for axis in range(2):  # the east (x) and north (y) faces
            inner, ahead = _cells(axis, slice(1, -2)), _cells(axis, slice(2, -1))
            spread = torch.zeros_like(k_iso)
            spread[(*inner, slice(1, None))] = 0.25 * (
                k_iso[(*inner, slice(1, None))] + k_iso[(*inner, slice(None, -1))]
                + k_iso[(*ahead, slice(1, None))] + k_iso[(*ahead, slice(None, -1))]
            )  # fmt: skip
            spread[(*inner, 0)] = 0.5 * (k_iso[(*inner, 0)] + k_iso[(*ahead, 0)])
            total = torch.zeros_like(k_iso)[inner]
            for level in range(2):
                first, last = 1 - level, levels - 1 + level
                for side in range(2):
                    here = _cells(axis, slice(1 + side, -2 + side))
                    across = tuple(g[(*inner, slice(first, None))] for g in gradients[axis])
                    vertical = sum(
                        d[(*here, slice(first, None))] * g[(*here, slice(None, last))]
                        for d, g in zip((density_by_t, density_by_s), gradients[2], strict=True)
                    )
                    tilt = slope(here, across, slice(first, None), vertical)
                    taper = self._taper(tilt)
                    water = masks[axis + 1][(*inner, slice(first, None))]
                    total[..., first:] += (
                        widths_z[1][:last] * water * torch.maximum(steep, spread[(*inner, slice(first, None))] * taper)
                    )
                    slopes[axis][(*inner, slice(first, None), side, level)] = taper * tilt * water
            k[axis][inner] = total / (4.0 * widths_z[0])

        cells, top = (slice(2, -2), slice(2, -2)), slice(None, -1)
        totals = [torch.zeros_like(k_iso)[(*cells, top)] for _ in range(2)]
        face_weights = (widths_x[1], cosines[1] * widths_y[1])
        for level in range(2):
            levels_here = slice(level, levels - 1 + level)
            vertical = sum(
                d[(*cells, levels_here)] * g[(*cells, top)]
                for d, g in zip((density_by_t, density_by_s), gradients[2], strict=True)
            )
            for axis in range(2):  # the slopes at the top face, eastward then northward
                for side in range(2):
                    shifted = _cells(axis, slice(1 + side, -3 + side), other=slice(2, -2))
                    across = tuple(g[(*shifted, levels_here)] for g in gradients[axis])
                    tilt = slope(cells, across, levels_here, vertical)
                    taper = self._taper(tilt)
                    weight = _on_axis(face_weights[axis][1 + side : -3 + side], axis)
                    tapered = taper * tilt  # first: a steep slope's square would overflow float32, its taper is 0
                    totals[axis] += weight * k_iso[(*cells, top)] * tapered * tilt * mask_top[(*cells, top)]
                    slopes[2 + axis][(*cells, top, side, level)] = tapered * mask_top[(*cells, top)]
        k[2][(*cells, top)] = totals[0] / (4 * _on_axis(widths_x[0][2:-2], 0)) + totals[1] / (
            4 * _on_axis(widths_y[0][2:-2] * cosines[0][2:-2], 1)
        )
        k[2][(*cells, -1)] = 0.0
        return k, slopes

    def _taper(self, slope: torch.Tensor) -> torch.Tensor:
        """1 for a gentle slope, falling to 0 past ``SLOPE_LIMIT``."""
        return 0.5 * (1.0 + torch.tanh((self.SLOPE_LIMIT - torch.abs(slope)) / self.SLOPE_WIDTH))


def _cells(axis: int, along: slice, other: slice = slice(2, -2)) -> tuple[slice, slice]:
    """The horizontal cells ``along`` the face's ``axis`` (0: x, 1: y), ``other`` across it."""
    return (along, other) if axis == 0 else (other, along)


def _on_axis(values: torch.Tensor, axis: int) -> torch.Tensor:
    """A 1-D tensor along ``axis`` of an (x, y, z) grid, broadcast over the other two."""
    return values.reshape([-1 if i == axis else 1 for i in range(3)])


def _face_gradient(field: torch.Tensor, axis: int, water: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """How ``field`` changes across each cell's face along ``axis``, per ``step`` (zero at the last cell and on
    land)."""
    out = torch.zeros_like(field)
    here, ahead = [slice(None)] * 3, [slice(None)] * 3
    here[axis], ahead[axis] = slice(None, -1), slice(1, None)
    out[tuple(here)] = water[tuple(here)] * (field[tuple(ahead)] - field[tuple(here)]) / step
    return out


def ocean_isoneutral_mixing(batch: int) -> Built:
    """The stand-in on pyhpc's default grid (``batch`` grids stacked along x; float64, set by the bench workload),
    inputs drawn as pyhpc draws them: masks 80 % water, normal widths and fields, three time levels."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        x = batch * nx
        masks = (torch.rand(4, x, ny, nz) < 0.8).float()
        widths = (torch.randn(2, x), torch.randn(2, ny), torch.randn(2, nz))
        fields = (torch.randn(x, ny, nz, 3), torch.randn(x, ny, nz, 3))
        written = (torch.randn(3, x, ny, nz), torch.zeros(4, x, ny, nz, 2, 2))
        return (masks, *widths, torch.randn(2, ny), *fields, torch.randn(nz), torch.randn(x, ny, nz), *written), {}

    return OceanIsoneutralMixing(), make
