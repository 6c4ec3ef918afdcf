// Accessibility fixes for the page as served and for the elements Material's bundle
// creates when it starts (axe-core rules of WCAG 2.2 AA). Inlined by hooks.on_post_page.
//
// - A table, an equation, a row of tab labels or a code block wider than its column
//   scrolls sideways; a keyboard reader can scroll it only if it takes focus
//   (scrollable-region-focusable).
// - Each code block's copy button sits in an unnamed <nav>, so a notebook page with forty
//   code cells had forty identical navigation landmarks (landmark-unique); the buttons
//   are not site navigation, so their wrapper gets role="none".
(function () {
  "use strict";
  var pending = false;
  function fix() {
    pending = false;
    // (before the bundle starts, a code block scrolls on its <code> element and a table
    // on itself: the bundle then makes the code focusable and wraps the tables)
    var wide = [
      ".md-typeset__scrollwrap",
      ".math-display",
      ".md-typeset pre",
      ".md-typeset pre > code",
      ".md-typeset table",
      ".md-typeset .tabbed-labels",
    ].join(", ");
    document.querySelectorAll(wide).forEach(function (el) {
      if (!el.hasAttribute("tabindex") && el.scrollWidth > el.clientWidth + 1) {
        el.setAttribute("tabindex", "0");
      }
    });
    document.querySelectorAll("nav.md-code__nav:not([role])").forEach(function (nav) {
      nav.setAttribute("role", "none");
    });
  }
  function schedule() {
    if (!pending) {
      pending = true;
      requestAnimationFrame(fix);
    }
  }
  new MutationObserver(schedule).observe(document.documentElement, {
    childList: true,
    subtree: true,
  });
  window.addEventListener("resize", schedule);
  // the page as served, before any script changes it
  schedule();
})();
