// Accessibility fixes for elements Material's bundle creates at run time (axe-core rules
// of WCAG 2.2 AA). Inlined by hooks.on_post_page just before the bundle.
//
// - A table, an equation or a notebook output wider than its column scrolls sideways;
//   a keyboard reader can scroll it only if it takes focus (scrollable-region-focusable).
// - Each code block's copy button sits in an unnamed <nav>, so a notebook page with forty
//   code cells had forty identical navigation landmarks (landmark-unique); the buttons
//   are not site navigation, so their wrapper gets role="none".
(function () {
  "use strict";
  var pending = false;
  function fix() {
    pending = false;
    var wide = ".md-typeset__scrollwrap, .math-display, .md-typeset pre";
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
})();
