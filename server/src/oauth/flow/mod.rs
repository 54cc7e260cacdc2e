//! The sign-in flow toward an upstream's authorization server (see [`super`]).
