package codegen

// targetSMs is the streaming multiprocessors of the cards the bundle's grids are shaped for:
// an H200's and an H100 SXM's 132. Every "one wave" in codegen (a grid of one block or CTA an
// SM, or of as many as an SM holds) counts from it; a card with fewer SMs runs such grids in
// more waves, with the same results.
const targetSMs = 132
