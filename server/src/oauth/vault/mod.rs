//! The token vault: what each caller holds for each upstream (see [`super`]).
