// Copy buttons on the executed-starter pages. The hooks replace nbconvert's
// inline copy widget with <button class="nb-copy" data-copy-target="cell-N">;
// one delegated listener serves every page, including after instant navigation.
document.addEventListener("click", (event) => {
  const button = event.target.closest("button.nb-copy");
  if (!button) return;
  const source = document.getElementById(button.dataset.copyTarget);
  if (!source || !navigator.clipboard) return;
  navigator.clipboard.writeText(source.textContent).then(() => {
    button.classList.add("nb-copy--done");
    setTimeout(() => button.classList.remove("nb-copy--done"), 1200);
  });
});
