// The article below the first screen, and the accessibility fixes that need its layout
// (axe-core rules of WCAG 2.2 AA). Inlined by hooks.on_post_page.
//
// - With scripting, site.css gives the blocks below the first screen (data-later: the
//   article's, a notebook's cells and their outputs, or runs of a long code block's
//   lines, marked by later.py at build time where what is above them is certainly taller
//   than 1,000 px) content-visibility: auto, so while the page loads the browser styles
//   and lays out only those near the screen (on the longest pages the rest was most of
//   the main thread's work before the reader could scroll). Once the page has loaded, this lays the
//   blocks out in document order, in tasks of about 5 ms (at least one block each) between
//   which the browser can handle input and draw; it marks each block laid out
//   (data-shown), then <html data-settled>. A block on screen at its turn keeps the layout
//   containment it was drawn with (data-shown="on-screen"), so that nothing the reader
//   sees moves.
// - A page opened at a #fragment was scrolled there while the blocks above were
//   placeholders; they grow as they are laid out, and a browser without scroll anchoring
//   (Safari) drifts with them. So a settle that laid blocks out ends by scrolling to the
//   fragment again, unless the reader has scrolled, touched or pressed a key meanwhile.
//   (A position the browser restores, on a reload or Back, needed no such help in
//   Chromium with anchoring off: tests/test_browser.py holds both.)
// - A table, an equation, a row of tab labels, a chart or a code block wider than its column
//   scrolls sideways; a keyboard reader can scroll it only if it takes focus
//   (scrollable-region-focusable). Each block's are checked as it is laid out (for a
//   run of a code block's lines, its code block, as wide as the runs laid out so far).
//   Until then they are not, so a Tab pressed before the page has settled can miss one.
//   The whole page's are checked once settled and again when elements are added to the
//   page or the window is resized, and a <details>'s or a tab set's when it is opened or
//   switched (what a closed <details> holds, its summary aside, is not measured until
//   then).
// - Each code block's copy button sits in an unnamed <nav>, so a notebook page with forty
//   code cells had forty identical navigation landmarks (landmark-unique); the buttons
//   are not site navigation, so their wrapper gets role="none".
(function () {
  "use strict";
  var root = document.documentElement;
  // in a window at most 480 px wide (as site.css), data-later="narrow" blocks are deferred too
  var NARROW = window.matchMedia("(max-width: 480px)");
  function deferred() {
    return (NARROW.matches ? "[data-later]" : '[data-later=""]') + ":not([data-shown])";
  }
  function blocks() {
    return document.querySelectorAll(deferred());
  }
  // (before the bundle starts, a code block scrolls on its <code> element and a table
  // on itself: the bundle then makes the code focusable and wraps the tables)
  var WIDE = [
    ".md-typeset__scrollwrap",
    ".math-display",
    ".md-typeset pre",
    ".md-typeset pre > code",
    ".md-typeset table",
    ".md-typeset .tabbed-labels",
    ".md-typeset .lab-figure__chart",
  ].join(", ");
  var SLICE_MS = 5;
  var loaded = document.readyState === "complete";
  var running = false;
  var again = false;
  var pending = false;
  var inputs = 0; // the reader's scrolls, touches and key presses so far

  ["wheel", "touchmove", "keydown", "pointerdown"].forEach(function (type) {
    window.addEventListener(
      type,
      function () {
        inputs += 1;
      },
      { capture: true, passive: true }
    );
  });
  function shut(el) {
    // hidden in a closed <details> (any around it, but for its own summary): nothing there
    // can take focus until it opens (the toggle listener below), and measuring it makes
    // the browser lay the hidden content out (a closed note of MathML and code on lab
    // 03's guide: 80-110 ms at a phone's speed)
    var d = el.closest("details");
    while (d) {
      var summary = d.querySelector(":scope > summary");
      if (!d.open && !(summary && summary.contains(el))) return true;
      d = d.parentElement && d.parentElement.closest("details");
    }
    return false;
  }
  function focusable(scope) {
    var wide = Array.prototype.slice.call(scope.querySelectorAll(WIDE));
    if (scope.matches && scope.matches(WIDE)) wide.push(scope);
    var later = deferred();
    wide.forEach(function (el) {
      // one in a block not laid out yet (a notebook cell's outputs, inside the cell) is
      // measured at that block's turn: measuring it now would lay that block out here
      if (
        !el.hasAttribute("tabindex") &&
        !shut(el) &&
        !el.closest(later) &&
        el.scrollWidth > el.clientWidth + 1
      ) {
        el.setAttribute("tabindex", "0");
      }
    });
  }
  function fix() {
    focusable(document);
    document.querySelectorAll("nav.md-code__nav:not([role])").forEach(function (nav) {
      nav.setAttribute("role", "none");
    });
  }
  function show(block) {
    var box = block.getBoundingClientRect();
    var seen = box.bottom > 0 && box.top < window.innerHeight && box.height > 0;
    block.setAttribute("data-shown", seen ? "on-screen" : "");
    // reading its height lays the block out now, inside this slice, not in the next
    // frame together with every block the slice reached. A run of a code block's lines
    // holds no wide element: its code block is (as wide as the runs laid out so far)
    if (block.offsetHeight) focusable(block.closest("pre") || block);
  }
  function target(hash) {
    var id = hash.slice(1);
    try {
      id = decodeURIComponent(id);
    } catch (error) {
      // a malformed escape (#50%): the id as written
    }
    return id ? document.getElementById(id) : null;
  }
  // the next slice runs as a task of its own: input and frames can come first, and unlike
  // setTimeout a message is not held back 4 ms after a few in a row
  var channel = new MessageChannel();
  var next = null;
  channel.port1.onmessage = function () {
    var fn = next;
    next = null;
    fn();
  };
  // one message in flight at a time: the next slice, or the start of a settle (never both,
  // since a settle starts only while none is running)
  function later(fn) {
    next = fn;
    channel.port2.postMessage(0);
  }
  function settle(seen) {
    running = true;
    var queue = Array.prototype.slice.call(blocks());
    var laying = queue.length > 0;
    var hash = location.hash;
    function slice() {
      var start = performance.now();
      try {
        while (queue.length && performance.now() - start < SLICE_MS) show(queue.shift());
      } finally {
        if (queue.length) later(slice);
        else finish();
      }
    }
    function finish() {
      try {
        fix();
        var at = laying && inputs === seen && hash && location.hash === hash && target(hash);
        if (at) at.scrollIntoView();
      } finally {
        running = false;
        if (again) {
          again = false;
          schedule();
        } else {
          root.setAttribute("data-settled", "");
        }
      }
    }
    slice();
  }
  function schedule() {
    root.removeAttribute("data-settled");
    if (!loaded) return;
    if (running) {
      again = true;
    } else if (!pending) {
      pending = true;
      var seen = inputs;
      // in a task after the next frame's work: run in the frame's own callback, the first
      // slice would hold that frame back by its length (on a first load, possibly the
      // page's first paint: so it was in Lighthouse's runs)
      requestAnimationFrame(function () {
        later(function () {
          pending = false;
          settle(seen);
        });
      });
    }
  }
  // a <details> opened shows elements the passes skip (a <details> open in the page as
  // loaded fires toggle too, before load: the settle after load measures those); a tab
  // switched to shows elements measured while hidden, at width 0
  document.addEventListener(
    "toggle",
    function (event) {
      if (loaded && event.target.open) focusable(event.target);
    },
    true
  );
  document.addEventListener("change", function (event) {
    var set = event.target.closest && event.target.closest(".tabbed-set");
    if (set) focusable(set);
  });
  new MutationObserver(schedule).observe(root, { childList: true, subtree: true });
  window.addEventListener("resize", schedule);
  if (loaded) {
    schedule();
  } else {
    window.addEventListener("load", function () {
      loaded = true;
      schedule();
    });
  }
})();
